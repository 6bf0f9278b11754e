"""How a child process ended, in words (for engine-dead messages)."""

from __future__ import annotations

import signal


def describe_exit(code: int | None) -> str:
    """'exit code 1', 'killed by SIGKILL', or 'still running' for a multiprocessing exitcode."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
