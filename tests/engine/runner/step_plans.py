"""Shared by the runner's tests: a small engine's model runner, one step's plan over fresh blocks, and KV caches
filled with random values (so a forward pass that reads or writes the wrong rows shows)."""

from __future__ import annotations

import random

import torch

from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.engine.runner.model_runner import StepPlan


def small_runner(path: str, device: str, **config):
    """The model runner of an engine with 8-token blocks, 32 of them, and a max_model_len of 256."""
    engine = Engine(EngineConfig(model=path, device=device, block_size=8, num_gpu_blocks=32, max_model_len=256,
                                 **config))
    return engine.executor.runner


def step_plan(runner, shapes: list[tuple[int, int]], rng: random.Random) -> StepPlan:
    """A step's plan of (tokens already cached, new tokens) per sequence, each sequence in its own blocks; the cached
    tokens' KV is whatever the cache holds."""
    bs = runner.block_size
    ids, positions, slots, starts, seq_lens, tables = [], [], [], [0], [], []
    next_block = 0
    for cached, new in shapes:
        table = list(range(next_block, next_block + -(-(cached + new) // bs)))
        next_block += len(table)
        ids += [rng.randrange(200) for _ in range(new)]
        positions += list(range(cached, cached + new))
        slots += [table[p // bs] * bs + p % bs for p in range(cached, cached + new)]
        starts.append(starts[-1] + new)
        seq_lens.append(cached + new)
        tables.append(table)
    return StepPlan(ids, positions, slots, starts, seq_lens, tables, [s - 1 for s in starts[1:]], [], [])


def filled_caches(runner) -> list[torch.Tensor]:
    """Random values the shape and dtype of each of the runner's KV caches (seeded)."""
    gen = torch.Generator(device=runner.device).manual_seed(0)
    return [torch.randn(c.shape, generator=gen, device=c.device).to(c.dtype) for c in runner.kv_caches]
