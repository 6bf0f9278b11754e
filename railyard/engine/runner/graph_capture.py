"""Capturing hundreds of CUDA graphs in a row: without torch's per-capture device synchronisation and cache flushes,
and without an eager warm-up run before each capture that needs none.

Synchronisation. `torch.cuda.graph` waits for the whole device before every capture. Capturing records work, it
runs none, so nothing needs the wait; but while the checkpoint loads on another thread beside the capture, each wait
is one for that thread's copies in flight. `capture_graph` is torch's capture without the wait and the flushes.

Flushes. `torch.cuda.graph` also empties the caching allocator (and the pinned host cache, and with
`force_cudagraph_gc` runs `gc.collect()`) before every capture, so that one graph gets as much memory as can be
had: a walk of the allocator's free lists each time, for ~29 pieces of each of ~19 token counts plus every decode
batch size captured into one shared pool. vLLM skips them after its first graph for the same reason
(vllm/compilation/cuda_graph.py). The model runner empties the cache once before capture and measures the pool
after it, so nothing it accounts for changes.

Warm-ups. A run outside capture compiles or loads the Triton kernels a size needs (and tunes autotuned ones),
which must not happen under capture. Giving every size one (19 x 29 pieces and 20 decode sizes, each run eagerly
once and then captured) made it a large share of a warm start's capture time. But most sizes need exactly the kernels
the size before them loaded, so `capture_each` warms up only the first size, and any size whose capture meets a
kernel that is not loaded yet: `jit_forbidden` makes Triton raise `NeedsWarmUp` before it would compile or load one
(before any CUDA call, so the capture ends cleanly and is thrown away), and the size is warmed up and captured
again. vLLM v1 captures each size with no eager run of its own either (its cudagraph_num_of_warmups is 0 by
default), after one profile run of the largest step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


@contextlib.contextmanager
def capture_graph(graph: torch.cuda.CUDAGraph, pool=None, capture_error_mode: str = "global") -> Iterator[None]:
    """`torch.cuda.graph(graph, pool=pool, capture_error_mode=...)` without its device synchronisation and cache
    flushes (module docstring): work launched inside, on a side stream of this device, is captured into `graph`."""
    device = torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)), capture_error_mode=capture_error_mode)
        try:
            yield
        finally:
            graph.capture_end()


class NeedsWarmUp(RuntimeError):
    """A kernel would compile, load or be tuned under capture: the size wants an eager run first."""


def capturing() -> bool:
    """Whether this thread's current CUDA stream is being captured."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def jit_forbidden() -> Iterator[None]:
    """Inside: a Triton kernel launch under capture that misses Triton's in-memory cache raises NeedsWarmUp instead
    of compiling or loading the kernel (Triton's jit_cache_hook runs before either). Launches from a thread that is
    not capturing (a weight load beside the capture) go to the hook held before (the start-up timer's), which is
    restored on exit. Nothing to do where Triton is absent."""
    try:
        from triton import knobs
    except Exception:  # no Triton: no Triton kernel can compile under capture either
        yield
        return
    runtime = knobs.runtime
    saved = runtime.jit_cache_hook

    def refuse_under_capture(**kwargs) -> bool | None:
        if capturing():
            raise NeedsWarmUp("a Triton kernel would compile or load under CUDA graph capture")
        return saved(**kwargs) if saved is not None else None

    runtime.jit_cache_hook = refuse_under_capture
    try:
        yield
    finally:
        runtime.jit_cache_hook = saved


def capture_each(sizes: list[int], warm_up: Callable[[int], None], capture: Callable[[int], None]) -> list[int]:
    """capture(n) for each size in order; warm_up(n) (an eager run, then a device synchronisation) before the first
    capture, and before any capture that raised NeedsWarmUp under `jit_forbidden`, which is then run again
    unguarded (as every capture ran before). capture(n) must keep nothing of a capture that raised.
    Returns the sizes that were warmed up."""
    warmed: list[int] = []
    for n in sizes:
        if not warmed:
            warm_up(n)
            warmed.append(n)
        else:
            try:
                with jit_forbidden():
                    capture(n)
                continue
            except NeedsWarmUp:
                warm_up(n)
                warmed.append(n)
        capture(n)
    return warmed
