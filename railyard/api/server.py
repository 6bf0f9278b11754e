"""The HTTP server under `railyard serve`: uvicorn, stopped by Ctrl-C or SIGTERM with railyard's exit code
(railyard.errors.Stopped)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn

from railyard.errors import STOP_SIGNALS


class Server(uvicorn.Server):
    """uvicorn's server, which records the signal that stopped it instead of raising it again once stopped
    (uvicorn's own way, whose outcome depends on the handler the process started with)."""

    stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)
