"""Recordings for the doctor's tests. The healthy one (fixtures/doctor/good) was taken on a real H200 node;
each test copies it and breaks exactly one thing, the way that failure shows up on a real machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from railyard.cluster.doctor import CheckResult, run_checks
from railyard.cluster.doctor.probe import RecordedProbe

from ..conftest import FIXTURES

GOOD = FIXTURES / "doctor" / "good"


@pytest.fixture
def recording(tmp_path) -> Path:
    target = tmp_path / "rec"
    shutil.copytree(GOOD, target)
    return target


def by_name(directory: Path) -> dict[str, CheckResult]:
    return {r.name: r for r in run_checks(RecordedProbe(directory))}


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def gpu_nodes(data):
    return [n for n in data["items"] if "nvidia.com/gpu.product" in n["metadata"]["labels"]]
