"""Triton GPU kernels (imported only on the GPU path: CI has no GPU and no triton)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def fused_ops():
    """The fused elementwise kernels module, or None where triton is missing (layers then use torch)."""
    try:
        from railyard.engine.kernels import fused
    except ImportError:
        return None
    return fused
