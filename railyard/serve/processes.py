"""Everything `railyard cluster up` started goes when it stops: Ray's processes, the workers they spawned, and
what those spawned in turn (Serve's HAProxy, a CUDA MPS daemon).

Ray's own shutdown stops the processes it started, but not always their children: an HAProxy whose Ray worker was
killed is re-parented to init and keeps its ports. So this process makes itself a child subreaper (Linux
prctl): orphans among its descendants become its children instead of init's, and `stop_descendants` ends
whatever is still there once the stack is down. Elsewhere both do nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 5.0


def adopt_orphans() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(entry)] = int(fields[1])
    return out


def descendants(pid: int | None = None) -> list[int]:
    """The live descendants of `pid` (default: this process), parents before their children."""
    root = os.getpid() if pid is None else pid
    parents = _parents()
    found, frontier = [], [root]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier and p != root]
        found += kids
        frontier = kids
    return found


def command_name(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def stop_descendants(grace_s: float = TERM_GRACE_S) -> list[str]:
    """SIGTERM every descendant still alive, SIGKILL those left after grace_s; the names of those it stopped."""
    if not os.path.isdir("/proc"):
        return []
    pids = descendants()
    names = [command_name(p) for p in pids]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and set(pids) & set(descendants()):
        _reap()
        time.sleep(0.1)
    for pid in set(pids) & set(descendants()):
        _signal(pid, signal.SIGKILL)
    _reap()
    return names


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap() -> None:
    """Collect the exit status of children that ended (orphans adopted here would stay zombies until we exit)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
