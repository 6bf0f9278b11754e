"""What the client benchmarks' tests share: a real `railyard serve` app (uvicorn, the tiny model's engine process)
per test module, and `railyard bench <kind>` run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.api.conftest import serve_in_thread, tiny_engine


@pytest.fixture(scope="module")
def server(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model)) as running:
        yield running


def run_bench(kind: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m railyard.cli bench <kind> ARGS` in a subprocess, its output captured."""
    return subprocess.run([sys.executable, "-m", "railyard.cli", "bench", kind, *args],
                          capture_output=True, text=True, timeout=300)
