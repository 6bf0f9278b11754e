"""Sizing a replica: how much KV cache fits next to the weights, and how many replicas a request rate needs.

KV cache: every token of every layer stores a key and a value per KV head, so one block of `block_size`
tokens takes 2 * layers * kv_heads * head_dim * block_size * dtype_bytes. A replica's blocks are what the
GPUs' memory * gpu_memory_utilization leaves after the weights and a fixed per-GPU overhead (CUDA context,
activations, graphs). With tensor parallelism each GPU holds 1/tp of the weights and of every block, so the
arithmetic on totals is the same.

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
from railyard.shapes import shape_config, shape_names

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GIB = 1024**3
MIB = 1024**2
DEFAULT_OVERHEAD_BYTES = 2 * GIB  # per GPU: CUDA context, activations for one step, CUDA graphs


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide a decoder-only transformer's weight and KV-cache size."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    def params(self) -> int:
        """Parameter count: embeddings, (untied) lm_head, attention, gated MLP, norms."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        per_layer = q + kv + o + bias + mlp + norms
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embed + self.hidden


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


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A shape from a Hugging Face config.json mapping."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return ModelShape(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
            qk_norm=config.get("model_type") == "qwen3",
        )
    except KeyError as exc:
        raise ConfigError(f"config.json lacks {exc.args[0]!r}, needed to size the KV cache") from None


# The named shapes are railyard.shapes' config.json mappings (one table for the whole project).
SHAPES: dict[str, ModelShape] = {name: shape_from_config(shape_config(name)) for name in shape_names()}


def resolve_shape(name: str, checkpoint: str, shape: str | None = None) -> tuple[ModelShape, str] | None:
    """The model's shape and where it came from: the checkpoint's config.json if present, else a named shape."""
    config = Path(checkpoint) / "config.json"
    if config.is_file():
        return shape_from_config(json.loads(config.read_text())), str(config)
    for key in (shape, name):
        if key and key.lower() in SHAPES:
            return SHAPES[key.lower()], f"named shape {key.lower()}"
    if shape:
        raise ConfigError(f"unknown model shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    return None


def kv_bytes_per_block(shape: ModelShape, block_size: int, dtype_bytes: int) -> int:
    """Bytes of one KV-cache block across all layers: 2 (K and V) * layers * kv_heads * head_dim * block * dtype."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * block_size * dtype_bytes


@dataclass(frozen=True)
class KVSizing:
    """KV-cache capacity of one replica (all its GPUs together)."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def size_kv_cache(
    shape: ModelShape,
    *,
    gpu_memory_bytes: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    block_size: int,
    dtype: str,
    max_model_len: int,
    overhead_bytes_per_gpu: int = DEFAULT_OVERHEAD_BYTES,
) -> KVSizing:
    """How many KV blocks (and tokens, and full-length sequences) one replica holds."""
    dtype_bytes = DTYPE_BYTES[dtype]
    budget = int(gpu_memory_bytes * tensor_parallel_size * gpu_memory_utilization)
    weights = shape.params() * dtype_bytes
    overhead = overhead_bytes_per_gpu * tensor_parallel_size
    kv = max(0, budget - weights - overhead)
    per_block = kv_bytes_per_block(shape, block_size, dtype_bytes)
    blocks = kv // per_block
    blocks_per_seq = math.ceil(max_model_len / block_size)
    return KVSizing(
        gpus=tensor_parallel_size,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes=weights,
        overhead_bytes=overhead,
        kv_cache_bytes=kv,
        bytes_per_block=per_block,
        num_blocks=blocks,
        tokens=blocks * block_size,
        max_seqs_at_max_len=blocks // blocks_per_seq,
    )


# Fields read from a bench JSON, first present wins: railyard's `bench throughput` names, then the
# names vLLM's benchmark_serving uses for the same measurements.
REQUEST_RATE_FIELDS = ("requests_per_s", "request_throughput")
OUTPUT_RATE_FIELDS = ("output_tokens_per_s", "output_throughput")


@dataclass(frozen=True)
class EngineProfile:
    """One replica's measured capacity, from a bench JSON."""

    requests_per_s: float
    output_tokens_per_s: float | None
    source: str


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
    return EngineProfile(rate, tokens, str(path))


def replicas_for_rate(target_rps: float, profile: EngineProfile, utilization: float = 0.8) -> int:
    """Replicas needed so each runs at most `utilization` of its measured request rate."""
    if target_rps <= 0:
        raise ConfigError("target request rate must be positive")
    if not 0 < utilization <= 1:
        raise ConfigError("utilization must be in (0, 1]")
    return max(1, math.ceil(target_rps / (profile.requests_per_s * utilization) - 1e-9))
