"""`Background`: one call on a thread, its result (or its exception) taken later: start-up work that need not
wait for, or hold up, the work beside it (loading a tokenizer while the model loads).

Such work is mostly Python (importing transformers takes seconds), and the work beside it calls into torch
and reads files, releasing the GIL on every call. Taking it back then waits for the other thread to give it up,
which a thread running Python does only every `sys.getswitchinterval()` (5 ms by default): a loader that
releases the GIL thousands of times (once per tensor copy) waits that long each time, and loads several times
slower (a convoy). While background work runs, `short_gil_switches` shortens the interval.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# While background work runs: the longest a thread returning from a torch call or a read waits for the GIL; short
# enough that a weight load beside a busy Python thread is not slowed several times (docs/architecture.md).
SHORT_SWITCH_INTERVAL_S = 0.0002

_lock = threading.Lock()
_active = 0
_saved_interval = 0.005


@contextmanager
def short_gil_switches(interval_s: float = SHORT_SWITCH_INTERVAL_S) -> Iterator[None]:
    """Shorten the GIL switch interval while the block runs; nested or concurrent blocks share it, and the last
    to leave restores what was there before the first."""
    global _active, _saved_interval
    with _lock:
        if _active == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(interval_s, _saved_interval))
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                sys.setswitchinterval(_saved_interval)


class Background:
    """Runs fn(*args) on a thread at once, with short GIL switches while it runs; result() waits for it and
    returns or raises what it did; seconds is how long it ran (None until it has finished).

    Not a daemon thread: a process that exits early (a start-up error) waits for it, since leaving while it is
    inside an import of torch can abort the interpreter (exit 134, "terminate called without an active
    exception") instead of the error's one line and exit 2. Start-up work is bounded, so the wait is too."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "railyard-background") -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        start = time.perf_counter()
        with short_gil_switches():
            try:
                self._value = fn(*args)
            except BaseException as exc:  # handed to whoever takes the result
                self._error = exc
        self.seconds = time.perf_counter() - start

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
