"""The only place where requests become tensors: owns the model, the paged KV tensors and the swap pool.

Each step: copy swapped blocks, flatten the scheduled tokens (positions, slot mapping, block
tables, cu_seqlens), run the model once, compute logits only where a token is sampled, sample.
On one GPU the model runs from CUDA graphs: whole decode steps (cuda_graphs.py), and every other step up
to 2,048 tokens as graphed pieces around eager attention (piecewise_graphs.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from railyard.engine.runner.attention import AttentionMetadata, get_backend
from railyard.engine.startup.background import Background
from railyard.engine.runner.decode_graphs import DecodeGraphs, padded_block_tables
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.lora.request import LoRARequest
from railyard.engine.runner.kernels import fp8_ops
from railyard.engine.runner.layers.fp8 import FP8, cache_bits, gemm_path, scaled_mm_supported
from railyard.engine.runner.models.loader import build_empty, fill_from_checkpoint, random_weights
from railyard.engine.runner.layers.parallel import SINGLE, ParallelState
from railyard.engine.runner.piecewise_graphs import PiecewiseGraphs
from railyard.engine.runner.gemm_warmup import record_products, warm_products
from railyard.engine.runner.row_buckets import row_bucket, row_buckets
from railyard.engine.runner.sleep import (SleepingWeights, SleepMemory, allocating, device_bytes, put_to_sleep,
                                         wake_weights)
from railyard.engine.runner.warmup import (WarmLimits, WarmStep, ladder, max_step_tokens, peak_steps, prefill_step,
                                           sampling_variants, warm_steps)
from railyard.engine.runner.sampler import (DoneSample, PendingSample, SamplerOutput, SamplingRow, host_tensor,
                                            sample_async, to_device)
from railyard.engine.sched.block_manager import check_kv_fits
from railyard.engine.sched.scheduler import SchedulerOutput
from railyard.engine.sched.sequence import PLACEHOLDER
from railyard.engine.startup.jit_watch import as_start_up, starting, watch_after_ready
from railyard.engine.startup.timings import StartupTimes, TritonJitTimer, WeightLoad
from railyard.errors import ConfigError
from railyard.model.memory import GIB, MemoryBudget, piecewise_tokens, profile_tokens, reserve_bytes
from railyard.model.spec import ModelSpec

log = logging.getLogger("railyard.engine")

# model/precision.py's dtype names (weights, activations, KV-cache elements) -> torch dtypes
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": FP8}
CPU_KV_CACHE_GIB = 1.0  # KV pool budget when running on the CPU (no device memory to profile)


def _synchronize(device: torch.device) -> None:
    """Wait for the device, so a phase's time includes its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but torch sees no CUDA GPU; use --device cpu")
    return torch.device(name)


def _fp8_attention_backend(name: str, device: torch.device) -> str:
    """The attention backend for an FP8 KV cache: Triton converts e4m3 in registers only on sm_89+."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9):
        return name
    cap = "%d.%d" % torch.cuda.get_device_capability(device)
    if name == "triton":
        raise ConfigError(f"kv_cache_dtype fp8 with the triton attention backend needs a GPU of compute capability "
                          f"8.9 or newer (Ada, Hopper); this one is {cap}: use --attention-backend torch")
    log.warning("kv_cache_dtype fp8 on a GPU of compute capability %s: the torch attention backend runs it", cap)
    return "torch"


def _set_fp8_gemm(model: torch.nn.Module, fp8_gemm: str, device: torch.device, dtype: torch.dtype) -> None:
    """Give every FP8 linear layer the tensor-core GEMM fp8_gemm names; ConfigError where none will run (a named
    one needs FP8 tensor cores and a bfloat16 model: elsewhere the reference path runs, which "auto" accepts)."""
    if fp8_gemm != "auto" and not scaled_mm_supported(device, dtype):
        raise ConfigError(f"fp8_gemm {fp8_gemm!r} needs FP8 tensor cores (compute capability 8.9+) and a bfloat16 "
                          f"model; this run's FP8 GEMMs are the {gemm_path(device, dtype)}: leave fp8_gemm at auto "
                          "to run them")
    if fp8_gemm == "triton" and fp8_ops() is None:
        raise ConfigError("fp8_gemm 'triton' needs triton, which does not import here")
    for module in model.modules():
        if getattr(module, "quant", None) == "fp8":
            module.fp8_gemm = fp8_gemm


@dataclass
class StepPlan:
    """A step's inputs as plain host lists: cheap to build, to pickle and to broadcast to TP workers."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    sample_indices: list[int]  # rows of the flattened batch whose logits are sampled
    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    # Input ids still on the device (asynchronous scheduling): input_ids[feed_dst[i]] is the token the
    # previous step sampled in its row feed_src[i]; the host list holds a placeholder there.
    feed_dst: list[int] = field(default_factory=list)
    feed_src: list[int] = field(default_factory=list)
    # The sliding-window layers' slots and block tables, when their blocks are their own (else empty).
    sliding_slot_mapping: list[int] = field(default_factory=list)
    sliding_block_tables: list[list[int]] = field(default_factory=list)
    # [LoRA] each scheduled sequence's adapter slot (-1: the base model; empty: the engine serves no adapters),
    # and the adapters to load into their slots first
    lora_slots: list[int] = field(default_factory=list)
    lora_loads: list[tuple[int, LoRARequest]] = field(default_factory=list)


@dataclass
class ForwardPass:
    """A step whose forward pass is queued: the logits of its sampled rows (None if none) and their rows."""

    logits: torch.Tensor | None
    rows: list[SamplingRow]


class ModelRunner:
    """Runs one replica's model (or one tensor-parallel shard of it) on one device."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, model_dir: Path | None,
                 ps: ParallelState = SINGLE, device: torch.device | None = None) -> None:
        with starting():  # Triton JIT in here is start-up work; once built, jit_watch counts any as first use
            self._build(config, spec, model_dir, ps, device)
        if self.device.type == "cuda":  # only there do kernels compile on first use
            watch_after_ready()

    def _build(self, config: EngineConfig, spec: ModelSpec, model_dir: Path | None, ps: ParallelState,
               device: torch.device | None) -> None:
        self.config = config
        self.ps = ps
        self.model_dir = model_dir
        self.device = device or resolve_device(config.device)
        self._sleeping: SleepingWeights | None = None  # sleep mode: the weights while they are off the device
        # sleep mode on a GPU: the pools the weights and the KV cache live in, released under them while asleep
        self.sleep_memory = SleepMemory.for_device(self.device, config.enable_sleep_mode)
        self._recapture = False  # sleep mode: the graphs were dropped, wake-up captures them again
        self._rewarm = False  # sleep mode: the allocator's cache was emptied, wake-up runs the peak steps again
        if spec.quantization and not config.quantization:  # an FP8 checkpoint needs no flag
            log.info("the checkpoint is %s-quantized (config.json quantization_config): loading it as such",
                     spec.quantization)
        # The model as this run stores it: dtype, KV-cache dtype and weight quantization (the flag's, else the
        # checkpoint's own); weight bytes and the KV block's bytes, and with them the block count, follow from it
        # as the planner computes them.
        self.spec = spec = spec.with_precision(config.dtype, config.kv_cache_dtype, config.quantization,
                                               device_type=self.device.type)
        self.dtype = TORCH_DTYPES[spec.dtype]
        self.kv_dtype = self.dtype if spec.kv_cache_dtype == "auto" else TORCH_DTYPES[spec.kv_cache_dtype]
        self.quantization = spec.quantization
        backend = config.attention_backend
        if self.kv_dtype == FP8:
            backend = _fp8_attention_backend(backend, self.device)
        self.backend_cls = get_backend(backend, self.device.type)
        self.startup = StartupTimes()  # where this runner's start-up time went (the engine reports it)
        timed = self.startup.phase
        with timed("model_construction"):
            with allocating(self.sleep_memory, "weights"):
                model = build_empty(spec, self.dtype, self.device, self.backend_cls, ps)
            _synchronize(self.device)
        self.model = model
        self.lora = self._attach_lora()  # its slots stay on the device while asleep: they hold adapters, not weights
        if self.quantization == "fp8":
            _set_fp8_gemm(self.model, config.fp8_gemm, self.device, self.dtype)
            log.info("FP8 weights (per-channel scales, per-token activations); GEMMs: %s",
                     gemm_path(self.device, self.dtype, config.fp8_gemm))
        elif config.fp8_gemm != "auto":
            raise ConfigError(f"fp8_gemm {config.fp8_gemm!r} picks the GEMM of FP8 weights: this model has none "
                              "(add --quantization fp8, or leave fp8_gemm at auto)")
        # Where piecewise graphs will be captured, the checkpoint loads on a thread beside their capture (it needs
        # the weights' addresses, not their values): the phases then hold only the part of loading the capture did
        # not hide, and its whole time is a `background` entry. What loading sets on the host
        # (a checkpoint's KV-cache scales) is read by attention only, which the pieces leave out; the KV profile and
        # the decode graphs, which do read it, come after the load has finished.
        beside = model_dir is not None and self._piecewise_allowed()
        load: WeightLoad | None = None
        loader: Background | None = None
        if model_dir is None:  # a named shape with random weights (benchmarks): nothing to read from disk
            with timed("weight_loading"):
                random_weights(model, config.seed)
                _synchronize(self.device)
        elif beside:
            loader = Background(as_start_up(fill_from_checkpoint), model, model_dir, name="railyard-weights")
        else:
            with timed("weight_loading"):
                load = fill_from_checkpoint(model, model_dir)
                _synchronize(self.device)
            self.startup.record_weights(load, self.startup.phases["weight_loading"])
        attn = self.model.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.block_size = config.block_size
        self.memory: MemoryBudget | None = None  # the start-up report (None when num_gpu_blocks was given)
        # kernels compile at their first launch: the profile step and graph capture
        with TritonJitTimer(enabled=self.device.type == "cuda") as jit:
            # Captured before the memory profile, which counts their buffers and pool (they need no KV cache).
            try:
                with timed("piecewise_graphs"):
                    self.piecewise = self._capture_piecewise(beside_load=loader is not None)
            finally:
                if loader is not None:  # the rest of the load (raising its error, if any), before anything reads
                    with timed("weight_loading"):
                        load = loader.result()
                        _synchronize(self.device)
            if loader is not None:
                self.startup.record_weights(load, loader.seconds, beside=True)
            self._measure_piecewise()
            with timed("kv_profile"):
                self.num_gpu_blocks = config.num_gpu_blocks or self._profile_num_blocks()
            if config.num_gpu_blocks is None and config.max_model_len and config.max_num_batched_tokens:  # profiled:
                # refuse it now, not after graphs and warm-up (a size given is the engine core's to check)
                check_kv_fits(self.num_gpu_blocks, config.block_size, config.max_model_len,
                              config.max_num_batched_tokens, spec.kv_sliding_window)
            with timed("kv_allocation"):
                self.num_cpu_blocks = self._num_cpu_blocks()
                self._allocate_kv_cache()
                cpu_shape = (2, self.num_cpu_blocks, self.block_size, self.num_kv_heads, self.head_dim)
                pin = self.device.type == "cuda"
                self.cpu_caches = [torch.zeros(cpu_shape, dtype=self.kv_dtype, pin_memory=pin)
                                   for _ in range(spec.num_kv_tensors)] if self.num_cpu_blocks else []
                _synchronize(self.device)
            self._rows: dict[int, SamplingRow] = {}  # per live sequence
            self._fed: torch.Tensor | None = None  # the last launched step's sampled ids, on the device
            with timed("cuda_graphs"):
                self.graphs = self._capture_graphs()
            if self.device.type == "cuda":  # nothing compiles on the CPU (tests call warm_up themselves)
                with timed("warm_up"):
                    self.warm_up()
        jit.record(self.startup)

    def _allocate_kv_cache(self) -> None:
        """The device KV cache of num_gpu_blocks blocks (at start-up, and again on wake-up from sleep mode)."""
        spec = self.spec
        shape = (2, self.num_gpu_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        # One tensor per layer, but a sliding-window layer shares one with a full-attention layer (their
        # blocks are never the same: sched/block_manager.py); kv_caches is the model's per-layer view.
        with allocating(self.sleep_memory, "kv_cache"):
            self.kv_tensors = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
                               for _ in range(spec.num_kv_tensors)]
        self.kv_caches = [self.kv_tensors[spec.kv_tensor_of(i)] for i in range(spec.num_layers)]

    def _attach_lora(self):
        """[LoRA] The adapters' device slots on every linear layer of the decoder (None: the engine serves none)."""
        c = self.config
        if not c.enable_lora:
            return None
        from railyard.engine.runner.kernels import lora_ops
        from railyard.engine.runner.lora_adapters import LoRAAdapters

        if self.device.type == "cuda" and lora_ops() is None:
            raise ConfigError("LoRA adapters on the GPU need triton (their batched kernels), which does not import "
                              "here")
        max_tokens = max(c.max_num_batched_tokens, c.max_num_seqs,
                         profile_tokens(c.max_num_batched_tokens, c.max_model_len, c.max_num_seqs))
        return LoRAAdapters(self.model, self.spec, c, self.dtype, self.device, max_tokens)

    def _graphs_allowed(self) -> bool:
        """CUDA graphs run on single-GPU Triton runs only (TP collectives and the torch backend run eager)."""
        return (not self.config.enforce_eager and self.device.type == "cuda" and self.ps.world_size == 1
                and self.backend_cls.name == "triton")

    def _capture_graphs(self) -> DecodeGraphs | None:
        """Whole-step CUDA graphs (attention included) for pure decode steps."""
        if not self._graphs_allowed():
            return None
        c = self.config
        max_batch = min(c.cuda_graph_max_batch_size, c.max_num_seqs)
        return DecodeGraphs(self.model, self.kv_caches, max_batch, c.max_model_len, self.block_size, self.device,
                            sliding=self.sliding_blocks)

    def _piecewise_allowed(self) -> bool:
        return self.config.piecewise_cuda_graphs and self._graphs_allowed()

    def _capture_piecewise(self, beside_load: bool = False) -> PiecewiseGraphs | None:
        """CUDA graphs of everything but attention, for every other step (prefill chunks, mixed steps); with
        beside_load, while another thread loads the weights. `_measure_piecewise` then sets their memory."""
        self.piecewise_bytes = 0
        c = self.config
        if not self._piecewise_allowed():
            return None
        torch.cuda.empty_cache()
        self._reserved_before_piecewise = torch.cuda.memory_reserved(self.device)
        return PiecewiseGraphs(self.model, piecewise_tokens(c.max_num_batched_tokens, c.max_model_len,
                                                            c.max_num_seqs), self.device, beside_load=beside_load)

    def _measure_piecewise(self) -> None:
        """The piecewise graphs' memory (static buffers and pool) in `piecewise_bytes`: what the device holds more
        than before their capture, measured once a weight load beside it has freed its temporaries."""
        graphs = self.piecewise
        if graphs is None:
            return
        torch.cuda.empty_cache()
        self.piecewise_bytes = torch.cuda.memory_reserved(self.device) - self._reserved_before_piecewise
        log.info("piecewise CUDA graphs hold %.2f GiB (static buffers %.2f GiB, pool and graphs the rest)",
                 self.piecewise_bytes / GIB, graphs.static_bytes / GIB)

    # -- sleep mode (runner/sleep.py) ------------------------------------------------------------
    def sleep(self, level: int) -> None:
        """Give back the device memory of the KV cache (its contents are lost: the engine holds no sequence) and the
        weights (level 1: copied to host memory first; level 2: read from the checkpoint again on wake-up). With
        `sleep_memory` (a GPU) their addresses stay and so do the CUDA graphs; without, the graphs go too. The runner
        keeps its model, its sizes and its kernels, compiled and loaded."""
        _synchronize(self.device)  # nothing queued may still read what goes
        self._fed = None
        memory = self.sleep_memory
        if memory is None:
            self.graphs = self.piecewise = None
            self.kv_tensors, self.kv_caches = [], []
            self._recapture = True
        if self._sleeping is None:
            self._sleeping = put_to_sleep(self.model, level, self.device, memory)
        if memory is not None and not self._kv_released:
            memory.pools["kv_cache"].release()
        self._rewarm = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self, tags: frozenset[str] = frozenset({"weights", "kv_cache"})) -> StartupTimes:
        """Undo `sleep` for the parts tags names ("weights", "kv_cache"): weights back on the device, the KV cache
        back at the same number of blocks (zeroed), and, once both are there, the graphs captured again if sleep
        dropped them, and the warm-up's peak steps run (warmup.peak_steps: the start's kernels are all still loaded,
        only the allocator's cache must grow back), so no kernel compiles, no graph is captured and the allocator
        does not grow on the step loop after it. Returns where its time went (phases as start-up names them;
        weights_to_device for the host copy's return)."""
        times = StartupTimes()
        timed = times.phase
        with starting(), TritonJitTimer(enabled=self.device.type == "cuda") as jit:
            asleep = self._sleeping
            if "weights" in tags and asleep is not None:
                with timed("weights_to_device" if asleep.level == 1 else "weight_loading"):
                    wake_weights(asleep, self.device, self.sleep_memory)
                    if asleep.level == 2:
                        self._reload_weights()
                    _synchronize(self.device)
                self._sleeping = None
            if "kv_cache" in tags and self._kv_released:
                with timed("kv_allocation"):
                    self.sleep_memory.pools["kv_cache"].restore()
                    for t in self.kv_tensors:
                        t.zero_()
                    _synchronize(self.device)
            elif "kv_cache" in tags and not self.kv_tensors:
                if self._sleeping is None:  # as at start-up: the piecewise graphs before the cache
                    with timed("piecewise_graphs"):
                        self._recapture_piecewise()
                with timed("kv_allocation"):
                    self._allocate_kv_cache()
                    _synchronize(self.device)
            if self._rewarm and not self.is_sleeping:
                if self._recapture:
                    with timed("cuda_graphs"):
                        if self.piecewise is None:  # the cache came back before the weights
                            self._recapture_piecewise()
                        self.graphs = self._capture_graphs()
                    self._recapture = False
                if self.device.type == "cuda":
                    with timed("warm_up"):
                        self.warm_up(peaks_only=True)
                self._rewarm = False
        jit.record(times)
        return times

    def _recapture_piecewise(self) -> None:
        """The piecewise graphs captured again (a wake-up: no weight load beside them) and their memory measured."""
        self.piecewise = self._capture_piecewise()
        self._measure_piecewise()

    def _reload_weights(self) -> None:
        """Level 2's wake-up: the weights as start-up filled them (the checkpoint, or a named shape's seed)."""
        if self.model_dir is None:
            random_weights(self.model, self.config.seed)
        else:
            fill_from_checkpoint(self.model, self.model_dir)

    @property
    def _kv_released(self) -> bool:
        """Sleep mode on a GPU: the KV cache's pool is released under its tensors (kept)."""
        return self.sleep_memory is not None and self.sleep_memory.pools["kv_cache"].released

    @property
    def is_sleeping(self) -> bool:
        return self._sleeping is not None or not self.kv_tensors or self._kv_released

    def device_memory(self) -> dict[str, int]:
        """Bytes held now: the weights and the KV cache on the device, the weights' host copy while asleep."""
        weights = [*self.model.parameters(), *self.model.buffers()]
        memory = self.sleep_memory
        if memory is not None and memory.pools["weights"].released:  # their storage is there, unmapped
            weights = [t for t in weights if not memory.holds(t, "weights")]
        return {"weights": device_bytes(weights),
                "kv_cache": 0 if self._kv_released else device_bytes(self.kv_tensors),
                "host_weights": self._sleeping.host_bytes if self._sleeping is not None else 0}

    # -- sizing ----------------------------------------------------------------------------------
    @property
    def sliding_blocks(self) -> bool:
        """Whether the sliding-window layers keep their KV in blocks of their own (sequence.sliding_table)."""
        return bool(self.spec.sliding_layers)

    @property
    def block_bytes(self) -> int:
        """One KV block on this rank at the cache's element size (1 byte for FP8), from the model description
        (the planner sizes with the same number)."""
        return self.spec.kv_bytes_per_block(self.block_size, self.ps.world_size)

    def _profile_num_blocks(self) -> int:
        """KV blocks from the memory left beside the weights and the largest step (model/memory.py's formula)."""
        c = self.config
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())  # tied ones once
        if self.device.type != "cuda":
            # No device memory to profile: a fixed KV budget, no more than every seat at full length needs. The
            # report holds what is allocated, so its num_blocks is the engine's.
            seats = -(-c.max_num_seqs * c.max_model_len // self.block_size)
            blocks = max(1, min(seats, int(CPU_KV_CACHE_GIB * GIB) // self.block_bytes))
            self.memory = MemoryBudget(weights + blocks * self.block_bytes, 1.0, weights, 0, 0, 0, self.block_bytes)
            return blocks
        # Measure the peak of the largest step (weights, rotary tables and activations), give the rest to KV blocks.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        n = profile_tokens(c.max_num_batched_tokens, c.max_model_len, c.max_num_seqs)
        scratch_bytes = self._dummy_forward(n)
        torch.cuda.synchronize(self.device)
        static = self.piecewise.static_bytes if self.piecewise is not None else 0  # counted in piecewise_bytes
        peak = torch.cuda.max_memory_allocated(self.device) - scratch_bytes - static
        free, total = torch.cuda.mem_get_info(self.device)
        # Memory used by others on this GPU (other processes, the CUDA context) counts against our share.
        used_elsewhere = total - free - torch.cuda.memory_reserved(self.device)
        lora = self.lora.device_bytes if self.lora is not None else 0  # allocated before the peak: in it
        self.memory = MemoryBudget(total, c.gpu_memory_utilization, weights, peak - weights - lora,
                                   max(0, used_elsewhere),
                                   reserve_bytes(c.max_num_seqs, self.spec.vocab_size, c.enforce_eager)
                                   + self.piecewise_bytes,
                                   self.block_bytes, lora)
        if self.memory.num_blocks < 1:
            raise ConfigError(
                f"no GPU memory left for the KV cache (weights + activations peak at {peak / GIB:.1f} GiB of "
                f"{total / GIB:.1f} GiB); raise gpu_memory_utilization or lower max_num_batched_tokens"
            )
        torch.cuda.empty_cache()
        log.info("memory profile (a %d-token step, KV cache in %s): %s", n, str(self.kv_dtype).removeprefix("torch."),
                 self.memory.describe())
        return self.memory.num_blocks

    def _dummy_forward(self, num_tokens: int) -> int:
        """One prefill of num_tokens through a scratch cache (for memory profiling); returns the scratch bytes."""
        dev, bs = self.device, self.block_size
        n_blocks = -(-num_tokens // bs)
        scratch = [torch.zeros((2, n_blocks, bs, self.num_kv_heads, self.head_dim), dtype=self.kv_dtype, device=dev)
                   for _ in range(self.spec.num_kv_tensors)]  # (the sliding layers read the same block tables)
        scratch = [scratch[self.spec.kv_tensor_of(i)] for i in range(self.spec.num_layers)]
        ids = torch.zeros(num_tokens, dtype=torch.long, device=dev)
        pos = torch.arange(num_tokens, device=dev) % self.spec.max_position_embeddings
        meta = AttentionMetadata(
            slot_mapping=torch.arange(num_tokens, dtype=torch.long, device=dev),
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=dev),
            block_tables=torch.arange(n_blocks, dtype=torch.int32, device=dev)[None],
            max_query_len=num_tokens, max_seq_len=num_tokens, query_start_loc_cpu=[0, num_tokens],
            seq_lens_cpu=[num_tokens])
        with torch.inference_mode():
            hidden = self.model(ids, pos, scratch, meta)
            self.model.compute_logits(hidden[-min(num_tokens, self.config.max_num_seqs):]).float()
        scratch_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in scratch}.values())
        del scratch
        return scratch_bytes

    def _num_cpu_blocks(self) -> int:
        if self.config.preemption_mode != "swap":
            return 0
        if self.config.num_cpu_blocks is not None:
            return self.config.num_cpu_blocks
        return int(self.config.swap_space * 2**30 // self.block_bytes)

    # -- one step --------------------------------------------------------------------------------
    def plan(self, out: SchedulerOutput) -> StepPlan:
        """Flatten the scheduled sequences into host lists (no device work)."""
        bs = self.block_size
        ids, positions, slots, starts, seq_lens, tables, sample_idx = [], [], [], [0], [], [], []
        feed_dst, feed_src, sliding_slots, sliding_tables = [], [], [], []
        sliding = self.sliding_blocks
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            table = seq.block_table
            if n == 1:  # decode: the common case at large batch, kept free of generator overhead
                ids.append(seq.token_at(start))
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                ids.extend(seq.token_at(i) for i in range(start, start + n))
                positions.extend(range(start, start + n))
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if sliding:
                window_table = seq.sliding_table
                sliding_slots.extend(window_table[p // bs] * bs + p % bs for p in range(start, start + n))
                sliding_tables.append(window_table)
            if ids[-1] == PLACEHOLDER:  # sampled by the step still in flight: only its last token can be
                feed_dst.append(len(ids) - 1)
                feed_src.append(seq.pending_row)
            starts.append(starts[-1] + n)
            seq_lens.append(start + n)
            tables.append(table)
            if item.sample:
                sample_idx.append(starts[-1] - 1)
        lora_slots = [] if self.lora is None else \
            [-1 if item.seq.lora is None else out.lora_slots[item.seq.lora.lora_int_id] for item in out.scheduled]
        return StepPlan(ids, positions, slots, starts, seq_lens, tables, sample_idx, out.swap_out, out.swap_in,
                        feed_dst, feed_src, sliding_slots, sliding_tables,
                        lora_slots=lora_slots, lora_loads=out.lora_loads)

    def sampling_rows(self, out: SchedulerOutput) -> list[SamplingRow]:
        return [self._row(item.seq) for item in out.scheduled if item.sample]

    def to_metadata(self, plan: StepPlan) -> AttentionMetadata:
        dev = self.device
        starts = plan.query_start_loc
        meta = AttentionMetadata(
            slot_mapping=host_tensor(plan.slot_mapping, torch.long, dev),
            query_start_loc=host_tensor(starts, torch.int32, dev),
            seq_lens=host_tensor(plan.seq_lens, torch.int32, dev),
            block_tables=to_device(torch.from_numpy(padded_block_tables(plan.block_tables)), dev),
            max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
            max_seq_len=max(plan.seq_lens),
            query_start_loc_cpu=starts,
            seq_lens_cpu=plan.seq_lens,
        )
        if plan.sliding_block_tables:
            meta.sliding = dataclasses.replace(
                meta, slot_mapping=host_tensor(plan.sliding_slot_mapping, torch.long, dev),
                block_tables=to_device(torch.from_numpy(padded_block_tables(plan.sliding_block_tables)), dev))
        return meta

    def _row(self, seq) -> SamplingRow:
        """The sequence's sampling row, built once (its token lists are the sequence's own, live)."""
        row = self._rows.get(seq.seq_id)
        p = seq.params
        if row is None:
            gen = None
            if p.seed is not None and not p.greedy:
                gen = torch.Generator(device=self.device).manual_seed(p.seed + seq.index)
            row = self._rows[seq.seq_id] = SamplingRow(p, seq.prompt_token_ids, seq.output_token_ids, [], gen)
        if p.min_tokens:  # EOS and stop ids are forbidden until min_tokens are out
            row.suppress_ids = list(p.stop_token_ids) + ([] if p.ignore_eos else list(seq.eos_token_ids)) \
                if len(seq.output_token_ids) < p.min_tokens else []
        return row

    def forget(self, seq_id: int) -> None:
        """Drop per-sequence state (its sampling row and generator) once it finished."""
        self._rows.pop(seq_id, None)

    def swap(self, plan: StepPlan) -> None:
        """Copy preempted blocks out to the CPU pool and resumed ones back (FP8 caches as raw bytes)."""
        if plan.swap_out:
            src = torch.tensor([g for g, _ in plan.swap_out], device=self.device)
            dst = torch.tensor([c for _, c in plan.swap_out])
            for gpu, cpu in zip(self.kv_tensors, self.cpu_caches):
                cache_bits(cpu)[:, dst] = cache_bits(gpu)[:, src].to("cpu")
        if plan.swap_in:
            src = torch.tensor([c for c, _ in plan.swap_in])
            dst = torch.tensor([g for _, g in plan.swap_in], device=self.device)
            for gpu, cpu in zip(self.kv_tensors, self.cpu_caches):
                cache_bits(gpu)[:, dst] = cache_bits(cpu)[:, src].to(self.device, non_blocking=True)

    @torch.inference_mode()
    def compute_logits(self, plan: StepPlan, fed: torch.Tensor | None = None) -> torch.Tensor | None:
        """Swap, run the forward pass and return float logits of the sampled rows (None if none).

        fed: the previous step's sampled ids on the device, for plan.feed_dst / feed_src.
        Every tensor-parallel rank runs this with the same plan (its collectives must match).
        """
        self.swap(plan)
        if not plan.input_ids:
            return None
        if self.lora is not None:
            for slot, request in plan.lora_loads:
                self.lora.load(slot, request)
            self.lora.stage(plan.lora_slots, plan.query_start_loc)
        feed = None
        if plan.feed_dst:
            if fed is None:
                raise RuntimeError("a step reads sampled ids that no step in flight produced")
            feed = (host_tensor(plan.feed_dst, torch.long, self.device),
                    fed[host_tensor(plan.feed_src, torch.long, self.device)])
        n = len(plan.input_ids)
        if (self.graphs is not None and n == len(plan.seq_lens) == len(plan.sample_indices)
                and n <= self.graphs.max_batch):  # decode only: one new token per sequence, each sampled
            return self.graphs.run(plan.input_ids, plan.positions, plan.slot_mapping, plan.seq_lens,
                                   plan.block_tables, feed, plan.sliding_slot_mapping, plan.sliding_block_tables)
        meta = self.to_metadata(plan)
        if self.piecewise is not None and n <= self.piecewise.max_tokens:  # graphs around eager attention
            hidden = self.piecewise.run(plan.input_ids, plan.positions, self.kv_caches, meta, feed)
        else:
            pad = [0] * (row_bucket(n, self.config.max_num_batched_tokens) - n)  # rows the library has run before
            ids = host_tensor(plan.input_ids + pad, torch.long, self.device)
            if feed is not None:
                ids[feed[0]] = feed[1]
            pos = host_tensor(plan.positions + pad, torch.long, self.device)
            hidden = self.model(ids, pos, self.kv_caches, meta, num_tokens=n)
        if not plan.sample_indices:
            return None
        m = len(plan.sample_indices)  # the LM head's rows, padded as the step's (the last row again)
        rows = plan.sample_indices + plan.sample_indices[-1:] * (row_bucket(m, self.config.max_num_seqs) - m)
        return self.model.compute_logits(hidden[host_tensor(rows, torch.long, self.device)])[:m]

    def launch(self, out: SchedulerOutput) -> PendingSample | DoneSample:
        """Queue one whole step (plan, forward, sample) without waiting for the device.

        The sampled ids stay on the device as the feed of the next launch, whose plan may hold
        placeholders for them (asynchronous scheduling)."""
        return self.launch_sample(self.launch_forward(out))

    def launch_forward(self, out: SchedulerOutput) -> ForwardPass:
        """Queue a step's forward pass only; `launch_sample` samples it (structured outputs: once the
        step's token bitmask is known, which may need the tokens of the step before)."""
        return ForwardPass(self.compute_logits(self.plan(out), self._fed), self.sampling_rows(out))

    @torch.inference_mode()  # the logits are inference tensors: masking writes them in place
    def launch_sample(self, forward: ForwardPass, bitmask=None) -> PendingSample | DoneSample:
        """Queue the sampling of a launched forward pass, its constrained rows masked by `bitmask`."""
        if forward.logits is None:
            return DoneSample(SamplerOutput([], []))
        if bitmask is not None:  # [structured outputs]
            from railyard.engine.runner.logits_mask import apply_bitmask

            apply_bitmask(forward.logits, bitmask)
        pending = sample_async(forward.logits, forward.rows)
        self._fed = pending.token_ids
        return pending

    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """One whole step in this process: plan, forward, sample, and wait for the sampled ids."""
        return self.launch(out).result()

    # -- the start-up warm-up (warmup.py) ----------------------------------------------------------
    def warm_limits(self) -> WarmLimits:
        """The limits a step can reach here, and what the captured graphs cover."""
        c = self.config
        return WarmLimits(c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, self.block_size,
                          decode_graph_batch=self.graphs.max_batch if self.graphs is not None else 0,
                          piecewise_tokens=self.piecewise.max_tokens if self.piecewise is not None else 0)

    @torch.inference_mode()
    def warm_up(self, peaks_only: bool = False) -> int:
        """Run every warm-up step (warmup.warm_steps) through this runner's own step path, sampling each, and swap
        blocks out and back where swapping is on; returns the number of steps. peaks_only (a wake-up): only the
        largest step of each walk (warmup.peak_steps), each sampling every kind of row, and the largest swap. Every
        tensor-parallel rank runs the same steps, so their collectives meet. Leaves no per-sequence state behind."""
        limits = self.warm_limits()
        steps = peak_steps(limits) if peaks_only else warm_steps(limits)
        variants = sampling_variants()
        fed = None
        start = time.perf_counter()
        pending = []  # waited for at the end: the host plans the next step while the device runs this one
        for i, step in enumerate(steps):
            plan = self._warm_plan(step, first_block=i, fed_rows=0 if fed is None else fed.shape[0])
            mixed = peaks_only or i % 2  # every kind of row (the sampler's largest path), else greedy only
            rows = [self._warm_row(variants[(i + r) % len(variants)] if mixed else variants[0], r)
                    for r in range(step.num_seqs)]
            pending.append(self.launch_sample(ForwardPass(self.compute_logits(plan, fed), rows)))
            fed = pending[-1].token_ids
        for sampled in pending:  # their host copies too, as a step's result() takes them
            sampled.result()
        if self.num_cpu_blocks:
            swaps = ladder(1, min(self.num_cpu_blocks, self.num_gpu_blocks, 17))
            for n in swaps[-1:] if peaks_only else swaps:
                pairs = [(b, b) for b in range(n)]
                self.swap(StepPlan([], [], [], [0], [], [], [], swap_out=pairs, swap_in=pairs))
        self._fed = None
        # A woken engine's process ran them at its start: the library's kernels stay loaded through sleep.
        products = self.warm_library_products() if self.device.type == "cuda" and not peaks_only else 0
        _synchronize(self.device)
        log.info("warm-up%s: %d steps (up to %d tokens, %d sequences, contexts of %d) and %d library GEMMs in %.2f s%s",
                 " (peak steps)" if peaks_only else "", len(steps), max((s.num_tokens for s in steps), default=0),
                 max((s.num_seqs for s in steps), default=0), self.config.max_model_len, products,
                 time.perf_counter() - start,
                 f"; the allocator holds {torch.cuda.memory_reserved(self.device) / GIB:.2f} GiB"
                 if self.device.type == "cuda" else "")
        return len(steps)

    @torch.inference_mode()
    def warm_library_products(self) -> int:
        """Run the library GEMMs (F.linear) of an eager step at every row bucket an eager step can pad to, and the
        LM head at every bucket of sampled rows (gemm_warmup.py); returns the number of products run. The eager
        step's products are recorded from one real eager step, the smallest (all ranks run the same)."""
        c = self.config
        lo = self.piecewise.max_tokens + 1 if self.piecewise is not None else 1
        hi = max_step_tokens(self.warm_limits())
        runs = 0
        if lo <= hi:
            plan = self._warm_plan(prefill_step(lo, c.max_model_len), first_block=0, fed_rows=0)
            head = self.model.lm_head.weight  # its rows are sampled rows, not the step's: walked below
            products = [p for p in record_products(lambda: self.compute_logits(plan)) if p.weight is not head]
            runs += warm_products(products, row_buckets(lo, hi), self.device)
        hidden = torch.zeros(c.max_num_seqs, self.spec.hidden_size, dtype=self.dtype, device=self.device)
        for rows in row_buckets(1, c.max_num_seqs):
            self.model.compute_logits(hidden[:rows])
            runs += 1
        return runs

    def _warm_plan(self, step: WarmStep, first_block: int, fed_rows: int) -> StepPlan:
        """A warm-up step as a StepPlan over KV blocks no sequence holds yet; its decodes read the previous warm-up
        step's sampled ids on the device where there was one (as asynchronous scheduling feeds them)."""
        bs, blocks, vocab = self.block_size, self.num_gpu_blocks, self.spec.vocab_size
        ids, positions, slots, starts, seq_lens, tables, sample = [], [], [], [0], [], [], []
        block = first_block
        for new, cached in step.rows():
            table = [(block + j) % blocks for j in range(-(-(cached + new) // bs))]
            block += len(table)
            for p in range(cached, cached + new):
                ids.append((7 * p + 3) % vocab)
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            starts.append(starts[-1] + new)
            seq_lens.append(cached + new)
            tables.append(table)
            sample.append(starts[-1] - 1)
        feed = list(range(len(step.decodes))) if fed_rows else []
        for row in feed:
            ids[row] = PLACEHOLDER
        sliding = self.sliding_blocks  # the window's tables: the same blocks (any block will do here)
        # [LoRA] rows through every adapter slot and the base model in turn (a slot holds zeros until loaded)
        lora_slots = [] if self.lora is None else [r % (self.config.max_loras + 1) - 1 for r in range(len(tables))]
        return StepPlan(ids, positions, slots, starts, seq_lens, tables, sample, [], [], feed_dst=feed,
                        feed_src=[r % max(fed_rows, 1) for r in feed], sliding_slot_mapping=slots if sliding else [],
                        sliding_block_tables=tables if sliding else [], lora_slots=lora_slots)

    def _warm_row(self, params: SamplingParams, r: int) -> SamplingRow:
        """A sampling row of the given kind for a warm-up step (its own generator where it is seeded)."""
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.device).manual_seed(params.seed + r)
        suppress = list(params.stop_token_ids) if params.min_tokens else []
        return SamplingRow(params, [1, 2, 3], [4, 5], suppress, gen)
