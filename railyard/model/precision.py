"""What one stored weight and one KV-cache element occupy: the dtype names every layer agrees on.

The engine maps these names to torch dtypes; the roofline and the planner only need their sizes.
A new precision (FP8 weights, an FP8 KV cache) is one entry in these tables: byte counts, and with
them weight bytes, KV bytes per token and the planner's sizing, follow everywhere at once.
"""

from __future__ import annotations

from railyard.errors import ConfigError

# Activation / unquantized weight dtypes (HF config.json's torch_dtype names) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPES = ("auto", *DTYPE_BYTES)

# KV-cache element dtypes beyond "auto" (= the model dtype) -> bytes per element. FP8 (issue 15) adds "fp8": 1.
KV_CACHE_DTYPE_BYTES: dict[str, int] = {}
KV_CACHE_DTYPES = ("auto", *KV_CACHE_DTYPE_BYTES)

# Weight quantization methods (config.json quantization_config.quant_method) -> bytes per quantized weight
# of the linear layers (embedding, norms and LM head keep the model dtype). FP8 (issue 15) adds "fp8": 1.
QUANTIZATION_BYTES: dict[str, int] = {}


def check_dtype(dtype: str) -> str:
    """A model dtype name, or ConfigError naming the supported ones."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """A KV-cache dtype name, or ConfigError naming the supported ones."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported (supported: "
                          f"{', '.join(KV_CACHE_DTYPES)}); use auto, the model's dtype")
    return kv_cache_dtype


def check_quantization(quantization: str | None) -> str | None:
    """A weight quantization method (None: unquantized), or ConfigError naming the supported ones."""
    if quantization is not None and quantization not in QUANTIZATION_BYTES:
        supported = ", ".join(["none", *QUANTIZATION_BYTES])
        raise ConfigError(f"quantization {quantization!r} is not supported (supported: {supported}); "
                          "use an unquantized checkpoint")
    return quantization


def resolve_dtype(dtype: str, checkpoint_dtype: str, device_type: str) -> str:
    """The dtype a run uses: "auto" is the checkpoint's (bfloat16 if it names none we run), float32 on the CPU,
    where half-precision matmuls are slow and imprecise."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype
    name = checkpoint_dtype if checkpoint_dtype in DTYPE_BYTES else "bfloat16"
    return "float32" if device_type == "cpu" else name
