"""Triton GPU kernels (imported only on the GPU path: CI has no GPU and no triton)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def fused_ops():
    """The fused elementwise kernels module (RMSNorm with residual, SiLU-and-mul, rotary), None when triton
    does not import (the layers then run their plain torch forms).

    Used for CUDA tensors: they cut the elementwise launches between the GEMMs (docs/architecture.md says by how
    much), and greedy tokens stay identical to HF transformers.
    """
    try:
        from railyard.engine.runner.kernels import fused
    except ImportError:
        return None
    return fused


@functools.lru_cache(maxsize=1)
def fp8_ops():
    """The FP8 quantization kernels module (per-token activation quantization), None when triton does not
    import; callers then use the torch reference (railyard.engine.runner.layers.fp8)."""
    try:
        from railyard.engine.runner.kernels import fp8
    except ImportError:
        return None
    return fp8


@functools.lru_cache(maxsize=1)
def lora_ops():
    """The batched LoRA kernels module (shrink / expand over adapter slots), None when triton does not import;
    callers then use the torch reference (railyard.engine.runner.layers.lora)."""
    try:
        from railyard.engine.runner.kernels import lora
    except ImportError:
        return None
    return lora
