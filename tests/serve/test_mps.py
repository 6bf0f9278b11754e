"""`cluster up` on a local Ray starts a CUDA MPS daemon for replicas that share a GPU, before Ray, and stops it.

A fake nvidia-cuda-mps-control on PATH (a shell script that records how it was called) stands in for the driver's
binary, which no CI machine has; the real one ran on the H200 (scripts/bench/ray-serve-gpu.sh MPS=1).
"""

from __future__ import annotations

import argparse
import os
import stat

import pytest

from railyard.serve import mps
from railyard.serve.cli import local_mps
from railyard.stack import Stack

FAKE = """#!/bin/sh
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat)" >> "{record}"
exit {rc}
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    def install(rc: int = 0):
        record = tmp_path / "calls.txt"
        binary = tmp_path / "bin" / mps.CONTROL
        binary.parent.mkdir(exist_ok=True)
        binary.write_text(FAKE.format(record=record, rc=rc))
        binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin:/bin")
        for key in mps.ENV_KEYS:
            monkeypatch.delenv(key, raising=False)
        return record
    return install


def test_the_daemon_starts_with_private_directories_exported_and_quits_on_stop(fake_control):
    record = fake_control()
    daemon = mps.start()
    assert daemon is not None and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
    assert os.path.isdir(daemon.pipe_dir) and os.path.isdir(daemon.log_dir)
    daemon.stop()
    calls = record.read_text().splitlines()
    assert calls[0].startswith(f"args=-d pipe={daemon.pipe_dir}")
    assert calls[1] == f"args= pipe={daemon.pipe_dir} stdin=quit"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and not os.path.exists(daemon.pipe_dir)


def test_a_failing_daemon_leaves_the_environment_alone(fake_control, caplog):
    fake_control(rc=1)
    assert mps.start() is None
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert "time-slice" in caplog.text


@pytest.mark.parametrize("gpu", [True, False])
def test_no_binary_no_daemon_and_a_warning_only_where_there_is_a_gpu(monkeypatch, tmp_path, caplog, gpu):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(mps, "has_nvidia_gpu", lambda: gpu)
    assert mps.start() is None and ("not found" in caplog.text) is gpu


def test_an_operator_s_daemon_is_used_not_replaced(fake_control, monkeypatch):
    record = fake_control()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/their-mps")
    assert mps.start() is None and not record.exists()


def _stack(**model) -> Stack:
    return Stack.model_validate({"name": "s", "image": "img", "models": [{"name": "m", "model": "/m", **model}]})


SHARED = {"num_replicas": 2, "gpu_fraction": 0.5, "engine": {"num_gpu_blocks": 64}}


@pytest.mark.parametrize("model, address, cpu, want", [
    (SHARED, None, None, True),
    (SHARED, "auto", None, False),  # someone else's Ray: its nodes' daemons are theirs
    (SHARED, None, True, False),  # engines on the CPU
    ({**SHARED, "gpu_sharing": "time-slicing"}, None, None, False),
    ({"num_replicas": 2}, None, None, False),  # whole GPUs
])
def test_cluster_up_starts_one_only_for_its_own_ray_and_replicas_sharing_gpus_by_mps(model, address, cpu, want):
    assert local_mps(_stack(**model), argparse.Namespace(address=address, cpu=cpu)) is want
