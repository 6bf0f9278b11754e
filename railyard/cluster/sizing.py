"""Sizing a replica: how much KV cache fits next to the weights, and how many replicas a request rate needs.

KV cache: the engine's own start-up formula (railyard.model.memory), per GPU, with the model description's
predictions where the engine measures: weights at the precision the replica runs, the activation peak of its
largest step, the CUDA context, the CUDA graphs' (decode and piecewise) and sampler's reserve, and the LoRA adapter
slots an engine serving adapters allocates; what utilization of the GPU's
memory leaves after them becomes blocks of `block_size` tokens (2 * layers * kv_heads * head_dim * block
* KV element bytes). With tensor parallelism each GPU holds its shard of the weights and of every block.
The model is accepted or refused by the engine's own rules, with the engine's message.

Replicas: from a measured engine profile (the bench JSON), one replica serves `requests_per_s`; the target
rate needs ceil(target / (requests_per_s * utilization)) replicas, keeping each below `utilization` of its
measured capacity so queues (and latency) stay short.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from railyard.errors import ConfigError
from railyard.model.memory import (CUDA_CONTEXT_BYTES, MemoryBudget, activation_bytes, lora_slot_bytes,
                                   piecewise_graph_bytes, piecewise_tokens, profile_tokens, reserve_bytes)
from railyard.model.spec import ModelSpec, check_max_model_len, check_tensor_parallel, read_model_spec
from railyard.shapes import shape_config, shape_names

GIB = 1024**3
MIB = 1024**2

# Per-GPU memory in MiB as GFD's nvidia.com/gpu.memory reports it, for inventories without that label.
GPU_MEMORY_MIB = {
    "NVIDIA-H200": 143771,
    "NVIDIA-H100-80GB-HBM3": 81559,
    "NVIDIA-A100-SXM4-80GB": 81920,
    "NVIDIA-A100-SXM4-40GB": 40960,
    "NVIDIA-L40S": 46068,
    "NVIDIA-L4": 23034,
    "NVIDIA-A10": 23028,
}

# The named shapes are railyard.shapes' config.json mappings (one table for the whole project).
SHAPES: dict[str, ModelSpec] = {name: ModelSpec.from_hf_config(shape_config(name)) for name in shape_names()}


def resolve_shape(name: str, checkpoint: str, shape: str | None = None) -> tuple[ModelSpec, str] | None:
    """The model's description and where it came from: the checkpoint's config.json if present, else a named
    shape. A config.json the engine would refuse raises the engine's error."""
    config = Path(checkpoint) / "config.json"
    if config.is_file():
        return read_model_spec(checkpoint), str(config)
    for key in (shape, name):
        if key and key.lower() in SHAPES:
            return SHAPES[key.lower()], f"named shape {key.lower()}"
    if shape:
        raise ConfigError(f"unknown model shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    return None


def engine_accepts(spec: ModelSpec, *, tensor_parallel_size: int, max_model_len: int, dtype: str,
                   kv_cache_dtype: str = "auto", quantization: str | None = None) -> ModelSpec:
    """The model as a replica's engine would run it (dtype, KV-cache dtype, weight quantization: None keeps the
    checkpoint's own), or the engine's own refusal (the same checks it runs)."""
    check_tensor_parallel(spec, tensor_parallel_size)
    check_max_model_len(max_model_len, spec.max_position_embeddings)
    return spec.with_precision(dtype, kv_cache_dtype, quantization)


@dataclass(frozen=True)
class KVSizing:
    """KV-cache capacity of one replica (all its GPUs together), and one GPU's predicted start-up report."""

    gpus: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    weights_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    bytes_per_block: int
    num_blocks: int
    tokens: int
    max_seqs_at_max_len: int
    per_gpu: MemoryBudget

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_gpu": self.per_gpu.as_dict()}


def size_kv_cache(
    spec: ModelSpec,
    *,
    gpu_memory_bytes: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    block_size: int,
    dtype: str,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    enforce_eager: bool = False,
    piecewise_cuda_graphs: bool = True,
    overhead_bytes_per_gpu: int | None = None,
    max_loras: int = 0,
    max_lora_rank: int = 16,
) -> KVSizing:
    """How many KV blocks (and tokens, and full-length sequences) one replica holds.

    overhead_bytes_per_gpu replaces the predicted activations, CUDA context and reserve with one figure.
    max_loras: the engine's LoRA adapter slots (0: it serves none), each max_lora_rank wide."""
    tp = tensor_parallel_size
    spec = engine_accepts(spec, tensor_parallel_size=tp, max_model_len=max_model_len, dtype=dtype,
                          kv_cache_dtype=kv_cache_dtype, quantization=quantization)
    if overhead_bytes_per_gpu is None:
        tokens = profile_tokens(max_num_batched_tokens, max_model_len, max_num_seqs)
        activations = activation_bytes(spec, tokens, max_num_seqs, tp)
        other, reserve = CUDA_CONTEXT_BYTES, reserve_bytes(max_num_seqs, spec.vocab_size, enforce_eager)
        if piecewise_cuda_graphs and not enforce_eager and tp == 1:  # the engine captures them on one GPU only
            reserve += piecewise_graph_bytes(spec, piecewise_tokens(max_num_batched_tokens, max_model_len,
                                                                    max_num_seqs))
    else:
        activations, other, reserve = overhead_bytes_per_gpu, 0, 0
    gpu = MemoryBudget(gpu_memory_bytes, gpu_memory_utilization, spec.weight_bytes(tp), activations, other, reserve,
                       spec.kv_bytes_per_block(block_size, tp), lora_slot_bytes(spec, max_loras, max_lora_rank, tp))
    blocks = gpu.num_blocks  # every rank holds its shard of each block
    return KVSizing(
        gpus=tp,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes=gpu.weights_bytes * tp,
        overhead_bytes=(activations + other + reserve + gpu.lora_bytes) * tp,
        kv_cache_bytes=gpu.kv_cache_bytes * tp,
        bytes_per_block=gpu.block_bytes * tp,
        num_blocks=blocks,
        tokens=blocks * block_size,
        # (sliding layers: their window)
        max_seqs_at_max_len=blocks // spec.kv_blocks_per_sequence(max_model_len, block_size),
        per_gpu=gpu,
    )


# Fields read from a bench JSON, first present wins: railyard's `bench throughput` names, then the
# names vLLM's benchmark_serving uses for the same measurements.
REQUEST_RATE_FIELDS = ("requests_per_s", "request_throughput")
OUTPUT_RATE_FIELDS = ("output_tokens_per_s", "output_throughput")


@dataclass(frozen=True)
class EngineProfile:
    """One replica's measured capacity, from a bench JSON, and what it was measured on (railyard's bench
    throughput records both; None where the file does not say)."""

    requests_per_s: float
    output_tokens_per_s: float | None
    source: str
    device: str | None = None  # as the driver names it ("NVIDIA H200"), or "cpu"
    model: dict | None = None  # {"name", and ModelSpec's dimensions: "hidden_size", "num_layers", ...}

    def mismatch(self, spec: ModelSpec, gpu_product: str | None) -> str | None:
        """Why this profile does not measure replicas of `spec` on `gpu_product` (a GFD label such as
        NVIDIA-H200), or None where it does or cannot tell."""
        reasons = []
        if self.model is not None:
            differ = [k for k, v in self.model.items() if k != "name" and hasattr(spec, k) and getattr(spec, k) != v]
            if differ:
                reasons.append(f"another model ({self.model.get('name')}: "
                               f"{', '.join(f'{k} {self.model[k]}' for k in differ)}"
                               f" against {', '.join(f'{k} {getattr(spec, k)}' for k in differ)})")
        if self.device is not None and gpu_product is not None and _chip(self.device) != _chip(gpu_product):
            reasons.append(f"another device ({self.device}, not {gpu_product})")
        return " and ".join(reasons) or None


def _chip(name: str) -> str:
    """A device name without vendor, punctuation and case: 'NVIDIA H200' and the label 'NVIDIA-H200' agree."""
    return "".join(c for c in name.lower().removeprefix("nvidia") if c.isalnum())


def load_profile(path: str | Path) -> EngineProfile:
    """Read a bench JSON (railyard bench throughput, or vLLM benchmark_serving's result file)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"bench file {path} not found") from None
    except ValueError as exc:
        raise ConfigError(f"bench file {path} is not JSON: {exc}") from None
    rate = next((float(data[f]) for f in REQUEST_RATE_FIELDS if isinstance(data.get(f), (int, float))), None)
    if rate is None or rate <= 0:
        raise ConfigError(f"bench file {path} has no positive {' or '.join(REQUEST_RATE_FIELDS)}")
    tokens = next((float(data[f]) for f in OUTPUT_RATE_FIELDS if isinstance(data.get(f), (int, float))), None)
    model = data.get("model") if isinstance(data.get("model"), dict) else None
    device = data.get("device") if isinstance(data.get("device"), str) else None
    return EngineProfile(rate, tokens, str(path), device, model)


def replicas_for_rate(target_rps: float, profile: EngineProfile, utilization: float = 0.8) -> int:
    """Replicas needed so each runs at most `utilization` of its measured request rate."""
    if target_rps <= 0:
        raise ConfigError("target request rate must be positive")
    if not 0 < utilization <= 1:
        raise ConfigError("utilization must be in (0, 1]")
    return max(1, math.ceil(target_rps / (profile.requests_per_s * utilization) - 1e-9))
