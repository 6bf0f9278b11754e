"""What one stored weight and one KV-cache element occupy: the dtype names every layer agrees on.

The engine maps these names to torch dtypes; the roofline and the planner only need their sizes.
A precision is one entry in these tables: byte counts, and with them weight bytes, KV bytes per token,
the engine's KV-block count and the planner's sizing, follow everywhere at once. The options that
name them (EngineConfig's dtype, kv_cache_dtype, quantization) are checked here, with one message each.
"""

from __future__ import annotations

from typing import Literal

from railyard.errors import ConfigError

# Activation / unquantized weight dtypes (HF config.json's torch_dtype names) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPES = ("auto", *DTYPE_BYTES)

# KV-cache element dtypes beyond "auto" (= the model dtype) -> bytes per element. "bfloat16": a half-precision
# cache under a float32 model (accuracy comparisons); "fp8": float8_e4m3fn with one K and one V scale per layer.
KV_CACHE_DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "fp8": 1}
KV_CACHE_DTYPES = ("auto", *KV_CACHE_DTYPE_BYTES)

# Weight quantization of the decoder's linear layers (the embedding, norms and LM head keep the model dtype):
# method -> bytes per quantized weight, and bytes of the scale each output channel carries (float32; a
# checkpoint's per-tensor scale is expanded per channel as it loads). FP8 checkpoints of either format
# config.json may declare (model/quant_config.py) load as "fp8".
QUANTIZATION_BYTES: dict[str, int] = {"fp8": 1}
QUANTIZATION_SCALE_BYTES: dict[str, int] = {"fp8": 4}
# The tensor-core GEMM of FP8 weights (engine option fp8_gemm; engine/layers/fp8.py says what each is): here, not
# in the engine, so that a stack file can name one and be checked without importing the engine.
Fp8Gemm = Literal["auto", "rowwise", "rowwise-fast", "cublaslt", "cublaslt-fast", "triton"]


def check_dtype(dtype: str) -> str:
    """A model dtype name, or ConfigError naming the supported ones."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """A KV-cache dtype name, or ConfigError naming the supported ones."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {kv_cache_dtype!r}")
    return kv_cache_dtype


def check_quantization(quantization: str | None) -> str | None:
    """A weight quantization method (None: unquantized), or ConfigError naming the supported ones."""
    if quantization is not None and quantization not in QUANTIZATION_BYTES:
        raise ConfigError(f"quantization must be {' or '.join(QUANTIZATION_BYTES)} (or unset), got {quantization!r}")
    return quantization


def resolve_dtype(dtype: str, checkpoint_dtype: str, device_type: str) -> str:
    """The dtype a run uses: "auto" is the checkpoint's (bfloat16 if it names none we run), float32 on the CPU,
    where half-precision matmuls are slow and imprecise."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype
    name = checkpoint_dtype if checkpoint_dtype in DTYPE_BYTES else "bfloat16"
    return "float32" if device_type == "cpu" else name
