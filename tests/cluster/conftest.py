"""Shared stacks for the cluster tests: small dicts, so each test shows what it changes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from railyard.stack import Stack, parse_stack

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

ONE_GPU: dict[str, Any] = {
    "name": "railyard",
    "image": "ghcr.io/example/railyard:0.1.0",
    "gpu_product": "NVIDIA-H200",
    "models": [{"name": "qwen2-7b", "model": "/models/qwen2-7b", "num_replicas": 2}],
}
TP2: dict[str, Any] = {
    "name": "railyard",
    "image": "ghcr.io/example/railyard:0.1.0",
    "gpu_product": "NVIDIA-H200",
    "models": [{"name": "llama3-8b", "model": "/models/llama3-8b", "tensor_parallel_size": 2, "num_replicas": 2}],
}
TWO_MODELS: dict[str, Any] = {
    "name": "multi",
    "namespace": "llm",
    "image": "ghcr.io/example/railyard:0.1.0",
    "models": [
        {
            "name": "qwen2-7b",
            "model": "/models/qwen2-7b",
            "gpu_product": "NVIDIA-L40S",
            "pools": [
                {"name": "short", "max_prompt_tokens": 1024, "engine": {"max_num_batched_tokens": 2048}},
                {"name": "long"},
            ],
        },
        {
            "name": "llama3-8b",
            "model": "/models/llama3-8b",
            "gpu_product": "NVIDIA-A100-SXM4-80GB",
            "tensor_parallel_size": 2,
            "autoscaling": {"min_replicas": 1, "max_replicas": 4},
        },
    ],
}
STACKS = {"one-gpu": ONE_GPU, "tp2": TP2, "two-models": TWO_MODELS}


def make_stack(base: dict[str, Any], **changes: Any) -> Stack:
    """A validated Stack from a base dict with top-level keys replaced."""
    data = copy.deepcopy(base)
    data.update(changes)
    return parse_stack(data)


@pytest.fixture(params=sorted(STACKS))
def any_stack(request) -> Stack:
    return make_stack(STACKS[request.param])
