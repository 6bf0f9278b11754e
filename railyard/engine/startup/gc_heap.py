"""Keep the start-up heap out of the garbage collector's full collections.

A serving process holds millions of long-lived objects from its start: modules, the model's modules and parameters,
the tokenizer's tables, the scheduler's block lists. CPython's oldest-generation collection walks every one of them,
so once in a few hundred steps a collection stalls the step loop (or the HTTP front) for tens of milliseconds, a gap
every stream sees between two tokens. `gc.freeze()` moves what exists at ready into a permanent generation that
collections skip; objects made later are collected as before. vLLM's engine core and API server do the same.

Only a process that keeps one engine for its life may freeze: an object frozen there is never collected if it later
becomes cyclic garbage, so a library user's process that builds and drops engines must not (Engine and LLM don't).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_startup_heap(collect: bool = True) -> int:
    """Collect what start-up left as garbage (a full collection, over the whole heap), then freeze the rest; returns
    the objects frozen in this process. collect=False freezes at once, start-up's garbage with the rest, held for the
    process's life: for a process whose start is on a burst's path and whose garbage holds no device memory (a Ray
    Serve replica's, which talks to its engine's process)."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """The heap frozen for the with-block only (yields the objects frozen): for a command that may run inside a
    longer-lived process (a test calling the CLI's main), whose objects go back to the collector after."""
    try:
        yield freeze_startup_heap()
    finally:
        gc.unfreeze()
