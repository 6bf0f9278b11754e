"""`Background`: one call on a thread, its result (or its exception) taken later: start-up work that need not
wait for, or hold up, the work beside it (loading a tokenizer while the model loads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """Runs fn(*args) on a daemon thread at once; result() waits for it and returns or raises what it did."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str = "railyard-background") -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to whoever takes the result
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
