"""Capturing hundreds of CUDA graphs in a row without torch's per-capture cache flushes.

Why: `torch.cuda.graph` empties the caching allocator (and, in recent torch, the pinned host cache, and with
`force_cudagraph_gc` runs `gc.collect()`) before every capture, so that one graph gets as much memory as can be
had. railyard captures ~29 pieces for each of ~19 token counts plus every decode batch size into one shared pool,
each flush a device synchronisation and a walk of the allocator's free lists: vLLM skips them for the same reason
after its first graph (vllm/compilation/cuda_graph.py). The model runner empties the cache once before capture
and measures the pool after it, so nothing it accounts for changes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def without_cache_flushes() -> Iterator[None]:
    """Inside: torch.cuda.empty_cache, torch._C._host_emptyCache (where torch has it) and gc.collect do nothing;
    restored on exit, exceptions included."""
    patched = [(torch.cuda, "empty_cache"), (gc, "collect")]
    if hasattr(torch._C, "_host_emptyCache"):
        patched.append((torch._C, "_host_emptyCache"))
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched]
    try:
        for owner, name in patched:
            setattr(owner, name, lambda *args, **kwargs: None)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
