"""Child processes of an engine (the engine core, tensor-parallel workers): how they end, in words, and
how they follow a parent that died without cleaning up."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading


EXITED_ELSEWHERE = 1 << 16  # the exit code of a process another one started: its parent got the real one


def describe_exit(code: int | None) -> str:
    """'exit code 1', 'killed by SIGKILL', or 'still running' for a multiprocessing exitcode."""
    if code is None:
        return "still running"
    if code == EXITED_ELSEWHERE:
        return "exited; its parent has the exit code"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def exit_when_parent_dies(grace_s: float | None = None) -> None:
    """Never outlive the parent (one killed with SIGKILL runs no cleanup): once it is gone, exit at once, or,
    with grace_s, send ourselves SIGTERM (the main thread shuts down what it owns) and exit after grace_s anyway."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        if grace_s is None:
            os._exit(1)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = threading.Timer(grace_s, os._exit, (1,))
        deadline.daemon = True
        deadline.start()

    threading.Thread(target=watch, name="railyard-parent-watch", daemon=True).start()
