"""Random paged-attention batches for the backend and kernel tests (and scripts/bench/correctness.py)."""

from __future__ import annotations

import random

import torch

from railyard.engine.runner.attention.metadata import AttentionMetadata

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = 8


def random_batch(cached: list[int], new: list[int], heads: int, kv_heads: int, dim: int, dtype, seed: int,
                 cache_dtype: torch.dtype | None = None, page: int = PAGE):
    """A random paged cache of `page`-token blocks whose sequence i already holds cached[i] tokens and gets new[i]
    more.

    cache_dtype: the cache's element type when it differs from the queries' (bf16, float8_e4m3fn)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    total = [c + n for c, n in zip(cached, new)]
    pages_needed = sum(-(-t // page) for t in total)
    free = list(range(1, pages_needed + 4))
    rng.shuffle(free)  # scattered, non-contiguous blocks
    tables = [[free.pop() for _ in range(-(-t // page))] for t in total]
    width = max(len(t) for t in tables)
    cache = torch.randn((2, pages_needed + 4, page, kv_heads, dim), generator=gen).to(cache_dtype or dtype)
    t_new = sum(new)
    q = torch.randn((t_new, heads, dim), generator=gen).to(dtype)
    k = torch.randn((t_new, kv_heads, dim), generator=gen).to(dtype)
    v = torch.randn((t_new, kv_heads, dim), generator=gen).to(dtype)
    slots, starts = [], [0]
    for table, c, n in zip(tables, cached, new):
        slots += [table[p // page] * page + p % page for p in range(c, c + n)]
        starts.append(starts[-1] + n)
    dev = DEVICE
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=dev),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(total, dtype=torch.int32, device=dev),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev),
        max_query_len=max(new), max_seq_len=max(total), query_start_loc_cpu=starts, seq_lens_cpu=total)
    return q.to(dev), k.to(dev), v.to(dev), cache.to(dev), meta
