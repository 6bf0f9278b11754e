"""Triton GPU kernels (imported only on the GPU path: CI has no GPU and no triton)."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def fused_ops():
    """The fused elementwise kernels module, or None where triton is missing (layers then use torch).

    RAILYARD_DISABLE_FUSED_KERNELS=1 forces the torch layers (to compare, or to rule the kernels out).
    """
    if os.environ.get("RAILYARD_DISABLE_FUSED_KERNELS", "") not in ("", "0"):
        return None
    try:
        from railyard.engine.kernels import fused
    except ImportError:
        return None
    return fused
