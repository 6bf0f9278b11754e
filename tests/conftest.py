"""Shared fixtures: tiny random-weight HF checkpoints, built once per test session."""

from __future__ import annotations

import pytest

from railyard.engine.startup.tiny_model import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """One tiny checkpoint per supported architecture: {"qwen2": dir, "qwen3": dir, "llama": dir, "qwen3moe": dir}."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: str(write_tiny_checkpoint(root / arch, arch)) for arch in ("qwen2", "qwen3", "llama", "qwen3moe")}


@pytest.fixture(scope="session")
def tiny_model(tiny_models) -> str:
    return tiny_models["qwen2"]
