"""A CUDA MPS control daemon for a local Ray stack whose replicas share a GPU (`gpu_sharing: mps`).

Why: two engine replicas on one GPU take turns in time slices unless their processes are clients of one MPS
daemon, under which their kernels run at the same time (docs/architecture.md says what it buys).
Rendered for Kubernetes, each worker pod starts one before `ray start` (railyard.cluster.pod); `railyard cluster
up` on a local Ray starts one here, before Ray, so every Ray worker inherits the pipe directory, and asks it to
quit when the stack stops.
Where the binary is missing or fails, the replicas time-slice as before, with one warning.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

log = logging.getLogger("railyard.serve")

CONTROL = "nvidia-cuda-mps-control"
ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@dataclass
class MpsDaemon:
    """A daemon this process started: its private directories and the binary that controls it."""

    control: str
    pipe_dir: str
    log_dir: str

    def env(self) -> dict[str, str]:
        return dict(zip(ENV_KEYS, (self.pipe_dir, self.log_dir)))

    def stop(self) -> None:
        """Ask the daemon to quit (it ends its server first), drop its variables from this environment."""
        try:
            subprocess.run([self.control], input="quit\n", env={**os.environ, **self.env()}, capture_output=True,
                           text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("the CUDA MPS daemon did not quit: %s", exc)
        for key in ENV_KEYS:
            if os.environ.get(key) in (self.pipe_dir, self.log_dir):
                del os.environ[key]
        self.remove_dirs()

    def remove_dirs(self) -> None:
        shutil.rmtree(self.pipe_dir, ignore_errors=True)
        shutil.rmtree(self.log_dir, ignore_errors=True)


def has_nvidia_gpu() -> bool:
    """Whether the NVIDIA driver's control device exists (checked without importing torch or CUDA)."""
    return os.path.exists("/dev/nvidiactl")


def start() -> MpsDaemon | None:
    """Start a daemon with private directories and export them to this process's environment (call it before
    Ray starts, whose processes inherit it); None where one is already configured or none can start."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        log.info("CUDA MPS: using the daemon at %s", os.environ["CUDA_MPS_PIPE_DIRECTORY"])
        return None
    control = shutil.which(CONTROL)
    if control is None:
        if has_nvidia_gpu():  # on a machine without one the replicas run on the CPU: nothing to share
            log.warning("gpu_sharing mps: %s not found; replicas sharing a GPU time-slice", CONTROL)
        return None
    daemon = MpsDaemon(control, tempfile.mkdtemp(prefix="railyard-mps-pipe-"),
                       tempfile.mkdtemp(prefix="railyard-mps-log-"))
    try:
        done = subprocess.run([control, "-d"], env={**os.environ, **daemon.env()}, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = subprocess.CompletedProcess([control, "-d"], 1, "", str(exc))
    if done.returncode != 0:
        log.warning("gpu_sharing mps: %s -d failed (%s); replicas sharing a GPU time-slice", CONTROL,
                    (done.stderr or done.stdout).strip()[:200])
        daemon.remove_dirs()
        return None
    os.environ.update(daemon.env())
    log.info("CUDA MPS: control daemon started (pipe %s)", daemon.pipe_dir)
    return daemon
