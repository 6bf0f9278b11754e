"""`EngineCore`: the step loop on token ids (add / abort / step / stats), vLLM v1's EngineCore.

It lets the scheduler pick each step's work, has the executor run it, appends the sampled tokens and
applies the stop rules that need no text (EOS, stop token ids, max_tokens, max_model_len). It emits
per-step `SeqDelta`s, never cumulative copies; text, stop strings and logprob bookkeeping belong to
the front's OutputProcessor, which tells the core to stop a sequence when a stop string matched.
It has no threads of its own: the engine-core process, the in-process client or `Engine` drive it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.core.model_info import ModelInfo
from railyard.engine.core.validation import check_priority, check_prompt_token_ids, check_sampling_params
from railyard.engine.core.wire import RequestRefused
from railyard.engine.outputs import EngineStats, SeqDelta
from railyard.engine.lora.peft import inspect_adapter
from railyard.engine.lora.request import LoRARequest
from railyard.engine.runner.logits_mask import warm_up_bitmask
from railyard.engine.runner.model_runner import ModelRunner
from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir
from railyard.engine.runner.sampler import DoneSample, PendingSample
from railyard.engine.sched.block_manager import BlockManager, check_kv_fits
from railyard.engine.sched.scheduler import Scheduler
from railyard.engine.sched.sequence import PLACEHOLDER, Sequence
from railyard.engine.startup.caches import configure_triton_cache, record_start
from railyard.engine.startup.jit_watch import jit_after_ready
from railyard.engine.startup.timings import StartupTimes
from railyard.engine.structured.manager import Accepted, StructuredOutputManager
from railyard.engine.tokenizer import LazyTokenizer, expects_tokenizer
from railyard.errors import ConfigError, InvalidRequestError, UnknownLoRAError
from railyard.model.spec import ModelSpec, read_model_spec

log = logging.getLogger("railyard.engine")

WAKE_TAGS = ("weights", "kv_cache")  # what sleep mode gives back and wake_up restores, as vLLM names them


@dataclass
class _InFlight:
    """A launched step: the sequences it samples for, in row order, and its tokens on their way.

    [structured outputs] With asynchronous scheduling a constrained step is launched as its forward pass only:
    `pending` is then the executor's forward pass and `mask` the future of its token bitmask, being filled on
    the manager's thread; the engine launches the sampling once the next step is scheduled (`_launch_sample`)."""

    sampled: list[Sequence]
    pending: PendingSample | DoneSample | object
    mask: Future | None = None


@dataclass
class _Request:
    request_id: str
    params: SamplingParams
    seqs: list[Sequence]
    num_unfinished: int


class EngineCore:
    """One replica's scheduler, block manager and executor, driven one step at a time."""

    @classmethod
    def from_config(cls, config: EngineConfig, startup: StartupTimes | None = None) -> "EngineCore":
        """A core for a checkpoint directory, or, when no such directory exists, for a named shape
        (railyard.shapes: qwen2-7b, ...) with random weights, for benchmarks where no weights travel."""
        from railyard.shapes import is_shape, shape_config

        if is_shape(config.model) and not Path(config.model).exists():
            log.warning("model %r is a named shape: random weights, for benchmarking only", config.model)
            return cls(config, spec=ModelSpec.from_hf_config(shape_config(config.model)), startup=startup)
        return cls(config, startup=startup)

    def __init__(self, config: EngineConfig, *, spec: ModelSpec | None = None, executor=None,
                 startup: StartupTimes | None = None) -> None:
        self.config = config
        # Where start-up time went (the engine-core process passes in what it timed before this, its imports).
        self.startup = startup if startup is not None else StartupTimes()
        started, timed_before = time.perf_counter(), self.startup.total_s
        triton_cache = configure_triton_cache()  # before any kernel compiles, here or in tensor-parallel workers
        if spec is None:
            model_dir = resolve_model_dir(config.model)
            spec = read_model_spec(model_dir)
            tokenizer_path: str | None = str(config.tokenizer or model_dir)
        else:  # a named shape with random weights (GPU benchmarks); token ids only
            model_dir = None
            tokenizer_path = config.tokenizer
        # The core needs of the tokenizer its EOS id (read from its files below) and, for grammars (structured
        # outputs) and in-process fronts, the HF tokenizer: loaded by its first user, after start-up (LazyTokenizer);
        # a served engine's front detokenises with its own copy.
        self._tokenizer = LazyTokenizer(tokenizer_path if expects_tokenizer(tokenizer_path) else None)
        self.tokenizer_path = tokenizer_path
        with self.startup.phase("tokenizer_eos"):  # before the model: a broken tokenizer fails fast
            tokenizer_eos = self._tokenizer.eos_token_id()
        self.model_dir = model_dir
        self.spec = spec
        config.resolve(spec.max_position_embeddings)
        if executor is None:
            executor_started = time.perf_counter()
            executor = _make_executor(config, spec, model_dir)
            timed = getattr(executor, "startup", None)  # a local runner's own phases; TP workers' are not broken down
            if timed is not None:
                self.startup.merge(timed)
            self.startup.add("executor", time.perf_counter() - executor_started - (timed.total_s if timed else 0.0))
        self.executor = executor
        bm = BlockManager(self.executor.num_gpu_blocks, self.executor.num_cpu_blocks, config.block_size,
                          config.enable_prefix_caching, sliding_window=spec.kv_sliding_window)
        try:  # a local runner checked as it sized the cache; an executor of given blocks, or of workers, here
            check_kv_fits(bm.gpu.num_blocks, config.block_size, config.max_model_len, config.max_num_batched_tokens,
                          bm.sliding_window)
        except ConfigError:
            self.executor.shutdown()  # no engine: don't leave tensor-parallel workers behind
            raise
        self.block_manager = bm
        self.scheduler = Scheduler(config, bm)
        eos = set(spec.eos_token_ids)
        if tokenizer_eos is not None:
            eos.add(tokenizer_eos)
        self.eos_token_ids = tuple(sorted(eos))
        self.requests: dict[str, _Request] = {}
        self.loras: dict[str, LoRARequest] = {}  # [LoRA] the adapters loaded, by name
        # [structured outputs] grammars and matchers of constrained sequences (idle until the first one)
        self.structured = StructuredOutputManager(self._tokenizer.get if self._tokenizer.path is not None else None,
                                                  spec.vocab_size, self.eos_token_ids,
                                                  config.structured_outputs_disable_any_whitespace,
                                                  warm_up_mask=_mask_warm_up(self.executor, spec.vocab_size))
        self._refused: list[RequestRefused] = []  # refused after the door: a bad add, a constraint that failed
        self._seq_ids = itertools.count()
        self.prompt_tokens_total = 0
        self.computed_tokens_total = 0
        self.num_steps_total = 0
        self.prefill_steps_total = 0
        self.decode_rows_total = 0
        self.generation_tokens_total = 0
        self.requests_finished_total = 0
        self.requests_added_total = 0
        self.async_scheduling = config.async_scheduling and self.executor.supports_async
        self._in_flight: _InFlight | None = None
        self._num_history_requests = 0  # live requests whose sampling reads their output tokens
        self.sleep_level = 0  # sleep mode: 0 awake, else the level it sleeps at
        self._asleep: set[str] = set()  # sleep mode: the parts wake_up has not restored yet (WAKE_TAGS)
        self.last_wake_up: StartupTimes | None = None  # sleep mode: where the last wake-up's time went
        self.startup.add("engine_other", time.perf_counter() - started - (self.startup.total_s - timed_before))
        self.startup.triton_cache_dir = self.startup.triton_cache_dir or str(triton_cache)
        if self.startup.kernel_cache is not None:  # a start that JIT'd kernels: how it met the cache, for doctor
            record_start({"model": config.model, "kernel_cache": self.startup.kernel_cache,
                          "triton_kernels": self.startup.triton_kernels,
                          "triton_compiled": self.startup.triton_compiled,
                          "triton_jit_s": round(self.startup.triton_jit_s, 3),
                          "triton_cache_dir": self.startup.triton_cache_dir,
                          "bytecode_cache": self.startup.bytecode_cache})
        log.info("engine ready: %d KV blocks of %d tokens (%d CPU swap blocks); max_model_len %d; "
                 "%d sequences of max_model_len fit at once", bm.gpu.num_blocks, config.block_size,
                 bm.cpu.num_blocks, config.max_model_len, bm.gpu.num_blocks * config.block_size // config.max_model_len)

    @property
    def tokenizer(self):
        """The HF tokenizer (None: token ids only), loaded on first use: in-process fronts take it from here."""
        return self._tokenizer.get()

    def model_info(self) -> ModelInfo:
        """The model's facts and limits, for fronts (they validate requests at the door with them)."""
        c = self.config
        created = int(self.model_dir.stat().st_mtime) if self.model_dir is not None else 0
        return ModelInfo(
            model=c.model, served_model_name=c.served_model_name or Path(c.model).name,
            tokenizer=self.tokenizer_path, max_model_len=c.max_model_len, vocab_size=self.spec.vocab_size,
            eos_token_ids=self.eos_token_ids, block_size=c.block_size, num_gpu_blocks=self.block_manager.gpu.num_blocks,
            num_cpu_blocks=self.block_manager.cpu.num_blocks, max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens, tensor_parallel_size=c.tensor_parallel_size,
            scheduling_policy=c.scheduling_policy, reasoning_parser=c.reasoning_parser,
            tool_call_parser=c.tool_call_parser, created=created,
            pids=[os.getpid(), *getattr(self.executor, "worker_pids", [])],
            startup=self.startup, loras=self.list_loras(), max_loras=c.max_loras if c.enable_lora else 0,
            max_lora_rank=c.max_lora_rank if c.enable_lora else 0)

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    arrival_time: float | None = None, priority: int = 0, lora: LoRARequest | None = None) -> None:
        """Queue a request (with a loaded LoRA adapter, or the base model); raises InvalidRequestError (and queues
        nothing) if it cannot be served, UnknownLoRAError if it names an adapter that is not loaded."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if lora is not None:
            lora = self._loaded_lora(lora)
        ids = list(prompt_token_ids)
        check_prompt_token_ids(ids, vocab_size=self.spec.vocab_size, max_model_len=self.config.max_model_len)
        check_sampling_params(params, vocab_size=self.spec.vocab_size)
        check_priority(priority, self.config.scheduling_policy)
        if params.structured_outputs is not None:  # [structured outputs] refuse a bad constraint at the door
            self.structured.validate(params.structured_outputs)
        now = arrival_time if arrival_time is not None else time.monotonic()
        seqs = [Sequence(next(self._seq_ids), request_id, i, list(ids), params, now, priority, self.eos_token_ids,
                         lora=lora) for i in range(params.n)]
        self.requests[request_id] = _Request(request_id, params, seqs, len(seqs))
        if params.structured_outputs is not None:  # [structured outputs] joins the scheduler once compiled
            self.structured.add(request_id, seqs, params.structured_outputs)
        else:
            for seq in seqs:
                self.scheduler.add(seq)
        self.prompt_tokens_total += len(ids)
        self.requests_added_total += 1
        if params.needs_output_history:
            self._num_history_requests += 1

    # -- LoRA adapters ---------------------------------------------------------------------------
    def load_lora(self, request: LoRARequest) -> None:
        """Check an adapter against the model and make it servable by name (read into host memory now where the
        model runs in this process); InvalidRequestError for a bad one, which changes nothing."""
        c = self.config
        if not c.enable_lora:
            raise InvalidRequestError("this engine serves no LoRA adapters: start it with --enable-lora")
        if request.lora_name in self.loras:
            raise InvalidRequestError(f"LoRA adapter {request.lora_name!r} is already loaded; unload it first")
        taken = next((r.lora_name for r in self.loras.values() if r.lora_int_id == request.lora_int_id), None)
        if taken is not None:
            raise InvalidRequestError(f"lora_int_id {request.lora_int_id} is already the id of LoRA adapter {taken!r}")
        inspect_adapter(request, self.spec, c.max_lora_rank)
        try:
            self.executor.prefetch_lora(request)
        except InvalidRequestError:
            raise
        except Exception as exc:  # the header was sound but the tensors do not read (a truncated file)
            raise InvalidRequestError(f"LoRA adapter {request.lora_name!r} could not be read: {exc}") from None
        self.loras[request.lora_name] = request
        log.info("loaded LoRA adapter %r (id %d) from %s", request.lora_name, request.lora_int_id, request.lora_path)

    def unload_lora(self, lora_name: str) -> None:
        """Stop serving an adapter by name (requests already running with it finish); UnknownLoRAError if none is
        loaded under that name."""
        request = self.loras.pop(lora_name, None)
        if request is None:
            raise UnknownLoRAError(f"no LoRA adapter named {lora_name!r} is loaded")
        if not any(seq.lora == request for seq in self.scheduler.live):
            self.scheduler.lora_slots.release(request.lora_int_id)
            self.executor.forget_lora(request.lora_int_id)
        log.info("unloaded LoRA adapter %r", lora_name)

    def list_loras(self) -> list[LoRARequest]:
        """The adapters loaded now, in the order they were loaded."""
        return list(self.loras.values())

    def _loaded_lora(self, lora: LoRARequest) -> LoRARequest:
        """A request's adapter as loaded (UnknownLoRAError: none by that name; an id that disagrees is refused)."""
        loaded = self.loras.get(lora.lora_name)
        if loaded is None:
            raise UnknownLoRAError(f"no LoRA adapter named {lora.lora_name!r} is loaded"
                                   + ("" if self.config.enable_lora else " (this engine serves none: --enable-lora)"))
        if loaded.lora_int_id != lora.lora_int_id:
            raise InvalidRequestError(f"LoRA adapter {lora.lora_name!r} is loaded with id {loaded.lora_int_id}, "
                                      f"not {lora.lora_int_id}")
        return loaded

    def abort(self, request_id: str) -> bool:
        """Stop a request in any state and free its blocks at once; False if it is unknown or done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self._forget_request(req)
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.abort(seq)
            self.executor.forget(seq.seq_id)
        self.structured.forget(request_id, [s.seq_id for s in req.seqs])  # [structured outputs]
        return True

    def stop_sequence(self, request_id: str, index: int, stop_reason: int | str | None = None) -> None:
        """Finish one sequence the front found finished (a stop string matched); frees its blocks now."""
        req = self.requests.get(request_id)
        if req is None or not 0 <= index < len(req.seqs) or req.seqs[index].is_finished:
            return
        self._finish(req, req.seqs[index], "stop", stop_reason)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None or self.structured.num_compiling > 0

    def can_step(self) -> bool:
        """There is work and the engine is awake: what drivers step on (requests sent to a sleeping engine wait)."""
        return not self.sleep_level and self.has_unfinished_requests()

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
               arrival_time: float | None = None, priority: int = 0, lora: LoRARequest | None = None) -> None:
        """add_request for a driver that answers its front after the step: a request the core refuses is
        kept for take_refused instead of raised."""
        try:
            self.add_request(request_id, prompt_token_ids, params, arrival_time=arrival_time, priority=priority,
                             lora=lora)
        except InvalidRequestError as exc:
            self._refused.append(RequestRefused(request_id, str(exc), type(exc).__name__))

    def take_refused(self) -> list[RequestRefused]:
        """Requests refused since the last call: by submit, or because their constraint failed to compile (those
        ended with "abort" deltas). The drivers tell their fronts why."""
        refused, self._refused = self._refused, []
        return refused

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[SeqDelta]:
        """Run one batch; returns what it added to each sequence (finished requests are forgotten after this).

        With asynchronous scheduling (the default where the executor supports it) a step launches batch
        N+1 before it waits for batch N's tokens and returns N's deltas: the host's scheduling and output
        work overlaps the device's forward pass. Decodes of N+1 read N's tokens on the device; a sequence
        that N's token finishes has one wasted row in N+1, discarded.
        """
        if self.sleep_level:
            raise InvalidRequestError("the engine is asleep: call wake_up() before stepping it")
        prev, self._in_flight = self._in_flight, None
        failed = self._admit_compiled(idle=prev is None) if self.structured.num_compiling else []  # [structured]
        results: list[SeqDelta] = []
        if prev is not None and self._num_history_requests > 0:
            # Penalties read every output token on the host, so those steps wait for the previous one.
            results, prev = self._complete(prev), None
        out = self.scheduler.schedule()
        if prev is not None and prev.mask is not None:
            # [structured outputs] prev's mask was filled while its deltas went out and this step was scheduled:
            # its sampling goes on the device now, right before this step's forward pass.
            self._launch_sample(prev)
        launched = None
        if not out.is_empty:
            launched, early = self._launch(out, prev)
            if early is not None:  # prev was completed inside: its tokens were needed for this step's masks
                results, prev = early, None
        if prev is not None:
            results = self._complete(prev)
        if launched is not None:
            if self.async_scheduling:
                self._in_flight = launched
            else:
                results = self._complete(launched)
        return failed + results if failed else results

    def _launch(self, out, prev: _InFlight | None) -> tuple[_InFlight, list[SeqDelta] | None]:
        """Launch a step; returns it and, if prev had to be completed first, prev's deltas.

        [structured outputs] A step that samples a constrained row is launched in two parts: its forward pass
        at once, its sampling once the rows' token bitmasks are filled. Those need every earlier token, so
        the step in flight (prev) is completed in between, while the new forward pass runs on the device.
        With asynchronous scheduling the mask is then filled on the manager's thread, and the sampling is
        launched by the next step, once that step is scheduled: the fill overlaps the host's output and
        scheduling work instead of adding to it, and the device gets the sampling and the next forward pass
        back to back."""
        now = time.monotonic()
        constrained = self.structured.needs_bitmask(out)
        pending = self.executor.launch_forward(out) if constrained else self.executor.launch(out)
        self.computed_tokens_total += out.num_batched_tokens
        self.num_steps_total += 1
        decode_rows = sum(1 for item in out.scheduled if item.num_new_tokens == 1
                          and item.seq.num_computed_tokens >= item.seq.num_prompt_tokens)
        self.decode_rows_total += decode_rows
        self.prefill_steps_total += out.num_batched_tokens > decode_rows
        self.scheduler.mark_computed(out)
        sampled: list[Sequence] = []
        for item in out.scheduled:
            seq = item.seq
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            if item.sample:
                seq.pending_row = len(sampled)
                seq.output_token_ids.append(PLACEHOLDER)
                seq.num_placeholders += 1
                sampled.append(seq)
        if not constrained:
            return _InFlight(sampled, pending), None
        early = self._complete(prev) if prev is not None else None
        if self.async_scheduling:
            return _InFlight(sampled, pending, self.structured.bitmask_async(sampled)), early
        return _InFlight(sampled, self.executor.launch_sample(pending, self.structured.bitmask(sampled))), early

    def _launch_sample(self, step: _InFlight) -> None:
        """[structured outputs] Queue the sampling of a step launched as its forward pass, once its mask is filled."""
        mask, step.mask = step.mask.result(), None
        step.pending = self.executor.launch_sample(step.pending, mask)

    def _admit_compiled(self, idle: bool) -> list[SeqDelta]:
        """[structured outputs] Constrained requests whose grammar is compiled join the scheduler; those whose
        compile failed end ("abort") and are refused. With nothing else to run, wait a moment for a compile
        instead of spinning."""
        idle = idle and not self.scheduler.has_unfinished()
        ready, failed = self.structured.take_ready(wait_s=0.005 if idle else 0.0)
        for seq in ready:
            if seq.request_id in self.requests:
                self.scheduler.add(seq)
        deltas = []
        for request_id, message in failed.items():
            req = self.requests.get(request_id)
            if req is not None:
                for seq in req.seqs:
                    self._finish(req, seq, "abort", None)
                    deltas.append(SeqDelta(request_id, seq.index, [], finish_reason="abort"))
                self._refused.append(RequestRefused(request_id, message))
                self.requests_added_total -= 1  # refused after all: the front counts it out as such
        return deltas

    def _complete(self, step: _InFlight) -> list[SeqDelta]:
        """Wait for a launched step's tokens and apply them: append, stop rules, deltas."""
        if step.mask is not None:  # [structured outputs] its sampling is not launched yet
            self._launch_sample(step)
        result = step.pending.result()
        deltas: list[SeqDelta] = []
        bm, bs = self.block_manager, self.config.block_size
        for seq, token, logprobs in zip(step.sampled, result.token_ids, result.logprobs):
            req = self.requests.get(seq.request_id)
            if req is None or seq.is_finished:  # aborted, or stopped by its previous token
                continue
            n_known = seq.num_known_output_tokens
            seq.output_token_ids[n_known] = token
            seq.num_placeholders -= 1
            self.generation_tokens_total += 1
            delta = SeqDelta(seq.request_id, seq.index, [token], None if logprobs is None else [logprobs])
            if n_known == 0:
                delta.first_scheduled_time = seq.first_scheduled_time
                delta.num_cached_prompt_tokens = seq.num_cached_prompt_tokens
            reason = self._stop_reason(seq, n_known + 1, token, self.structured.accept(seq, token))
            if reason is not None:
                del seq.output_token_ids[n_known + 1:]  # a row already launched for it is wasted
                seq.num_placeholders = 0
                delta.finish_reason, delta.stop_reason = reason
                self._finish(req, seq, *reason)
            elif seq.num_known_tokens % bs == 0:
                bm.cache_full_blocks(seq)  # its last block may have been waiting for this token
            deltas.append(delta)
        return deltas

    def _stop_reason(self, seq: Sequence, n_out: int, token: int,
                     accepted: Accepted) -> tuple[str, int | str | None] | None:
        """The stop rules that need no text, for the n_out-th output token, just made known (and `accepted`
        by the sequence's grammar, if it has one)."""
        p = seq.params
        if accepted is Accepted.REJECTED:  # [structured outputs] outside its grammar: a masking fault
            return ("abort", None)
        if n_out >= p.min_tokens:
            if token in p.stop_token_ids:
                return ("stop", token)
            if not p.ignore_eos and token in seq.eos_token_ids:
                return ("stop", None)
        if p.max_tokens is not None and n_out >= p.max_tokens:
            return ("length", None)
        if seq.num_prompt_tokens + n_out >= self.config.max_model_len:
            return ("length", None)
        if accepted is Accepted.TERMINATED:  # [structured outputs] the grammar is complete (its EOS, ignore_eos)
            return ("stop", None)
        return None

    def _finish(self, req: _Request, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        seq.finish(reason, stop_reason)
        self.scheduler.finish(seq)
        self.executor.forget(seq.seq_id)
        self.structured.forget(req.request_id, [seq.seq_id])  # [structured outputs]
        req.num_unfinished -= 1
        if req.num_unfinished == 0:
            self.requests.pop(req.request_id, None)
            self.requests_finished_total += 1
            self._forget_request(req)

    def _forget_request(self, req: _Request) -> None:
        if req.params.needs_output_history:
            self._num_history_requests -= 1

    # -- sleep mode (vLLM's names) -----------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Give the device memory back (runner.ModelRunner.sleep): level 1 keeps the weights in host memory, level 2
        reads them from the checkpoint again on wake-up. Refused while requests run or wait: nothing accepted is
        dropped (abort them first). Asleep already at the same level: nothing to do."""
        if not self.config.enable_sleep_mode:
            raise InvalidRequestError("sleep mode is off: start the engine with --enable-sleep-mode")
        if type(level) is not int or level not in (1, 2):
            raise InvalidRequestError(f"sleep level must be 1 (weights kept in host memory) or 2 (weights discarded), "
                                      f"got {level!r}")
        if self.sleep_level:
            if level == self.sleep_level and self._asleep == set(WAKE_TAGS):
                return
            raise InvalidRequestError(f"the engine is asleep (level {self.sleep_level}) already: wake it up first")
        if self.requests or self.has_unfinished_requests():
            raise InvalidRequestError(f"{len(self.requests)} requests are running or waiting: the engine sleeps only "
                                      "once they have finished (or been aborted)")
        started = time.perf_counter()
        self.block_manager.reset_prefix_cache()  # the blocks' contents go with the cache
        self.executor.sleep(level)
        self.sleep_level, self._asleep = level, set(WAKE_TAGS)
        log.info("asleep (level %d) in %.2f s: device memory %s", level, time.perf_counter() - started,
                 self.device_memory())

    def wake_up(self, tags: list[str] | None = None) -> dict | None:
        """Restore what sleep gave back (tags: some of WAKE_TAGS, vLLM's "weights" and "kv_cache"; None: both), the
        graphs captured and the warm-up run once both are back; logs where its time went and returns it
        (StartupTimes.as_dict). Awake: nothing to do (None)."""
        wanted = set(WAKE_TAGS if tags is None else tags)
        if not wanted or not wanted <= set(WAKE_TAGS):
            raise InvalidRequestError(f"wake_up tags must be some of {', '.join(WAKE_TAGS)}, got {tags!r}")
        if not self._asleep & wanted:
            return None
        times = self.executor.wake_up(frozenset(wanted))
        self._asleep -= wanted
        if not self._asleep:
            self.sleep_level = 0
        log.info("%s%s", times.describe("wake-up"), "" if not self._asleep else
                 f" (still asleep: {', '.join(sorted(self._asleep))})")
        self.last_wake_up = times
        return times.as_dict()

    def is_sleeping(self) -> bool:
        return bool(self.sleep_level)

    def device_memory(self) -> dict[str, int]:
        """Bytes the engine holds now: weights and KV cache on the device (rank 0's shard), the weights' host copy
        while asleep at level 1."""
        return self.executor.device_memory()

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm, sch = self.block_manager, self.scheduler
        total = bm.gpu.num_blocks
        return EngineStats(
            num_running=len(sch.running), num_swapped=len(sch.swapped),
            num_waiting=len(sch.waiting) + self.structured.num_compiling_seqs,  # [structured] compiling: waiting too
            num_free_blocks=bm.num_free_blocks, num_total_blocks=total,
            kv_cache_usage=bm.num_used_blocks / total if total else 0.0,
            num_cpu_blocks=bm.cpu.num_blocks, num_free_cpu_blocks=bm.cpu.num_free,
            prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
            prompt_tokens_total=self.prompt_tokens_total, computed_tokens_total=self.computed_tokens_total,
            num_steps_total=self.num_steps_total, decode_rows_total=self.decode_rows_total,
            prefill_steps_total=self.prefill_steps_total,
            generation_tokens_total=self.generation_tokens_total,
            num_preemptions_total=sch.num_preemptions, num_requests_finished_total=self.requests_finished_total,
            num_requests_added_total=self.requests_added_total, jit_after_ready_total=jit_after_ready(),
            block_size=self.config.block_size, max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens, sleep_level=self.sleep_level,
            **(self._lora_stats() if sch.lora_slots is not None else {}))

    def _lora_stats(self) -> dict:
        """[LoRA] adapters of running and waiting sequences, by name, and the slot loads so far."""
        sch = self.scheduler

        def names(seqs) -> list[str]:
            return sorted({seq.lora.lora_name for seq in seqs if seq.lora is not None})

        return dict(running_lora_adapters=names(sch.running), waiting_lora_adapters=names(sch.waiting + sch.swapped),
                    num_lora_loads_total=sch.lora_slots.num_loads)

    def check_invariants(self) -> None:
        """Raise AssertionError if any KV block leaked or ref counts disagree with the live sequences."""
        self.block_manager.check_invariants(self.scheduler.live)

    def cached_block_hashes(self) -> set[int]:
        return self.block_manager.cached_block_hashes()

    def check_health(self) -> None:
        """Raise EngineDeadError if a tensor-parallel worker died, even while the engine is idle."""
        self.executor.check_health()

    def shutdown(self) -> None:
        self.structured.shutdown()
        self.executor.shutdown()


def _mask_warm_up(executor, model_vocab_size: int):
    """The grammar thread's warm-up of the mask kernel on the sampling rank's logits (None: no runner here)."""
    runner = getattr(executor, "runner", None)
    if runner is None:
        return None
    return functools.partial(warm_up_bitmask, model_vocab_size=model_vocab_size, dtype=runner.dtype,
                             device=runner.device)


def _make_executor(config: EngineConfig, spec: ModelSpec, model_dir):
    if config.tensor_parallel_size > 1:
        from railyard.engine.runner.tp_executor import TensorParallelExecutor

        return TensorParallelExecutor(config, spec, model_dir)
    return LocalExecutor(ModelRunner(config, spec, model_dir))


class LocalExecutor:
    """Runs the model in this process (tensor_parallel_size 1); launches steps without waiting for them."""

    supports_async = True

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.startup = runner.startup
        self.num_gpu_blocks = runner.num_gpu_blocks
        self.num_cpu_blocks = runner.num_cpu_blocks

    def launch(self, out):
        return self.runner.launch(out)

    def launch_forward(self, out):
        return self.runner.launch_forward(out)

    def launch_sample(self, forward, bitmask):
        return self.runner.launch_sample(forward, bitmask)

    def execute(self, out):
        return self.runner.execute(out)

    def forget(self, seq_id: int) -> None:
        self.runner.forget(seq_id)

    def prefetch_lora(self, request: LoRARequest) -> None:
        self.runner.lora.prefetch(request)

    def forget_lora(self, lora_int_id: int) -> None:
        self.runner.lora.forget(lora_int_id)

    def sleep(self, level: int) -> None:
        self.runner.sleep(level)

    def wake_up(self, tags: frozenset[str]) -> StartupTimes:
        return self.runner.wake_up(tags)

    def device_memory(self) -> dict[str, int]:
        return self.runner.device_memory()

    def check_health(self) -> None:
        pass  # nothing outside this process can die

    def shutdown(self) -> None:
        pass
