"""Shared fixtures: tiny random-weight HF checkpoints, built once per test session."""

from __future__ import annotations

import pytest
import torch

# Triton's CPU interpreter where there is no GPU (the kernels' tests run in it), set before any test module is
# collected: Triton picks interpreted or compiled when a kernel is decorated, so a kernel module that an earlier
# test file imports must already see it (tests/engine/runner/attention/conftest.py patches the interpreter).
import tests.engine.runner.attention.conftest  # noqa: F401, E402

from railyard.engine.startup.tiny_model import write_tiny_checkpoint  # noqa: E402

# One torch thread in the test process. Its engines' processes size their own threads (every core but one on the
# CPU), so torch's default of one thread per core here oversubscribes the cores; OpenMP's threads then spin at each
# parallel region's barrier for a thread that another process holds off its core, which makes the suite many times
# slower on a machine where anything else runs beside it (a second copy of the suite, say).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """One tiny checkpoint per supported architecture: {"qwen2": dir, "qwen3": dir, "llama": dir, "qwen3moe": dir}."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: str(write_tiny_checkpoint(root / arch, arch)) for arch in ("qwen2", "qwen3", "llama", "qwen3moe")}


@pytest.fixture(scope="session")
def tiny_model(tiny_models) -> str:
    return tiny_models["qwen2"]
