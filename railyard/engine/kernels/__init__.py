"""Triton GPU kernels (imported only on the GPU path: CI has no GPU and no triton)."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def fused_ops():
    """The fused elementwise kernels module when RAILYARD_FUSED_KERNELS=1 and triton imports, else None.

    Opt-in: they pass their GPU unit tests against the torch layers, but the GPU benchmarks and the
    GPU greedy-vs-HF run in BENCHMARKS.md were measured with the torch layers; default on once measured.
    """
    if os.environ.get("RAILYARD_FUSED_KERNELS", "") in ("", "0"):
        return None
    try:
        from railyard.engine.kernels import fused
    except ImportError:
        return None
    return fused
