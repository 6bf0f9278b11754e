"""Triton kernels compiled or loaded after an engine said ready: counted and logged, since each is first-use work
on the serving path (a kernel compiled between two steps stalls every stream in the batch, up to a second).

One process-wide Triton cache hook, installed by the first engine to be ready, sees every kernel Triton is about
to compile or load from its disk cache (it runs before either). It counts them, except on a thread inside
`starting()`: an engine's start-up, whose warm-up runs every kind of step on purpose, or warm-up work kept off
the step loop (the grammar thread's). A hook held before it (a profiler's) still runs, and its answer stands.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

log = logging.getLogger("railyard.engine")
T = TypeVar("T")

KEEP = 32  # the first kernels JIT'd after ready, kept for the report (a test names them when it fails)

_local = threading.local()
_lock = threading.Lock()
_installed = False
_count = 0
_first: list[str] = []


@contextmanager
def starting() -> Iterator[None]:
    """Triton JIT on this thread inside the block is start-up work, not counted (nestable)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def as_start_up(fn: Callable[..., T]) -> Callable[..., T]:
    """fn, run inside `starting()` on whichever thread calls it (start-up work on a thread of its own)."""

    def run(*args, **kwargs) -> T:
        with starting():
            return fn(*args, **kwargs)

    return run


def in_start_up() -> bool:
    return getattr(_local, "depth", 0) > 0


def watch_after_ready() -> bool:
    """Install the hook (once per process); False where Triton does not import (nothing can compile then)."""
    global _installed
    try:
        from triton import knobs
    except Exception:
        return False
    with _lock:
        # Again where someone cleared the hooks since (a tool that sets them to None on its way out).
        if not _installed or knobs.runtime.jit_cache_hook is None:
            held = knobs.runtime.jit_cache_hook

            def after_ready(**kwargs):
                if not in_start_up():
                    _record(describe(kwargs))
                return held(**kwargs) if held is not None else None

            knobs.runtime.jit_cache_hook = after_ready
            _installed = True
    return True


def describe(hook_kwargs: dict) -> str:
    """What Triton is about to compile, from its cache hook's arguments: the kernel, its launch options, each
    runtime argument's type (`/16`: specialised as 16-byte aligned or divisible by 16) and the constexpr values.
    Triton's own `repr` lists the arguments wrongly (it zips them with a string's characters)."""
    text = str(hook_kwargs.get("repr", "?"))
    try:
        signature: dict = hook_kwargs.get("signature") or {}
        if not signature:
            return text
        names = list(signature)
        attrs = (hook_kwargs.get("configs") or [{}])[0] or {}
        args = [f"{name}: {kind}{'/16' if attrs.get((i,)) else ''}" for i, (name, kind) in enumerate(signature.items())
                if kind != "constexpr"]
        constexprs = {names[path[0]] if len(path) == 1 and path[0] < len(names) else str(path): value
                      for path, value in (hook_kwargs.get("constants") or {}).items()}
        return f"{text.split('(', 1)[0]}({', '.join(args)}) constexprs {constexprs}"
    except Exception:  # another Triton's hook arguments: its own description
        return text


def _record(kernel: str) -> None:
    global _count
    with _lock:
        _count += 1
        if len(_first) < KEEP:
            _first.append(kernel)
    log.warning("Triton JIT after the engine was ready (first-use work on the step loop; the start-up warm-up "
                "missed this specialisation): %s", kernel)


def jit_after_ready() -> int:
    """Kernels Triton compiled or loaded in this process, outside start-up, since the hook was installed."""
    return _count


def first_jit_after_ready() -> list[str]:
    """The first KEEP of them, as Triton describes them (name, launch options, each argument's specialisation)."""
    with _lock:
        return list(_first)
