"""Learned attention sinks and sliding windows (gpt-oss): the torch backend computes HF's eager attention (a sink
logit per head in each softmax denominator; keys more than window - 1 positions back masked), and the Triton
kernels compute what the torch backend computes, for decode (with context splits), prefill, chunked prefill and
prefix-cache hits, over float32 and FP8 caches. Block-table entries before a window may be freed: the kernels
must not read them.

GPU when there is one, else Triton's CPU interpreter (conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
from railyard.engine.runner.layers.fp8 import FP8
from tests.engine.runner.attention.paged_batch import PAGE, random_batch

HEADS, KV_HEADS, DIM = 4, 2, 32
WINDOW = 13  # not a multiple of the 8-token pages: windows start mid-page


def _sinks(heads: int = HEADS) -> torch.Tensor:
    return torch.tensor([0.5, -1.0, 2.0, 0.0] * (heads // 4), device=_device())


def _device() -> str:
    from tests.engine.runner.attention.paged_batch import DEVICE

    return DEVICE


def _torch_backend(window: int | None, sinks: torch.Tensor | None, heads=HEADS, kv_heads=KV_HEADS, dim=DIM):
    backend = TorchAttentionBackend(heads, kv_heads, dim, dim ** -0.5, sliding_window=window)
    backend.sinks = sinks
    return backend


def _dense_reference(q, k_all, v_all, q_pos, window, sinks, scale):
    """HF's eager attention for one sequence: q [n, H, d] at positions q_pos over all keys [s, Hk, d]."""
    groups = q.shape[1] // k_all.shape[1]
    k = k_all.repeat_interleave(groups, dim=1).transpose(0, 1)  # [H, s, d]
    v = v_all.repeat_interleave(groups, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ k.transpose(1, 2) * scale  # [H, n, s]
    k_pos = torch.arange(k.shape[1], device=q.device)[None, :]
    allowed = k_pos <= q_pos[:, None]
    if window:
        allowed &= k_pos > q_pos[:, None] - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(-1, 1, 1).expand(-1, scores.shape[1], 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :k.shape[1]]
    return (probs @ v).transpose(0, 1)


@pytest.mark.parametrize("window, with_sinks", [(WINDOW, False), (None, True), (WINDOW, True)])
@pytest.mark.parametrize("cached, new", [([0, 0], [40, 9]), ([30, 5], [1, 1]), ([24, 17], [20, 3])])
def test_torch_backend_is_hf_eager_attention_with_sinks_and_window(cached, new, window, with_sinks):
    q, k, v, cache, meta = random_batch(cached, new, HEADS, KV_HEADS, DIM, torch.float32, seed=1)
    sinks = _sinks() if with_sinks else None
    got = _torch_backend(window, sinks).forward(q, k, v, cache, meta)
    bs = cache.shape[2]
    for i, (c, n) in enumerate(zip(cached, new)):
        table = meta.block_tables[i, :-(-(c + n) // bs)].long()
        keys = cache[0][table].flatten(0, 1)[:c + n]
        values = cache[1][table].flatten(0, 1)[:c + n]
        s, e = meta.query_start_loc_cpu[i], meta.query_start_loc_cpu[i + 1]
        want = _dense_reference(q[s:e], keys, values, torch.arange(c, c + n, device=q.device), window, sinks,
                                DIM ** -0.5)
        torch.testing.assert_close(got[s:e], want, atol=1e-5, rtol=1e-5)


def _poison_freed_entries(cache: torch.Tensor, meta, window: int) -> None:
    """Point each sequence's table entries wholly before its first query's window at a block of NaN, as a freed
    (and reused) block could hold: a kernel that read them would return NaN."""
    used = set(meta.block_tables.flatten().tolist())
    poison = max(set(range(1, cache.shape[1])) - used)
    cache[:, poison] = float("nan")
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        first_query = seq_len - (meta.query_start_loc_cpu[i + 1] - meta.query_start_loc_cpu[i])
        live_from = max(0, first_query - window + 1) // cache.shape[2]
        meta.block_tables[i, :live_from] = poison


def _triton_against_torch(cached, new, window, sinks, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, splits=None,
                          cache_dtype=None, dtype=torch.float32, seed=0, tol=1e-4):
    pytest.importorskip("triton")
    from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend
    from railyard.engine.runner.kernels.paged_attention import paged_decode

    q, k, v, cache, meta = random_batch(cached, new, heads, kv_heads, dim, dtype, seed, cache_dtype=cache_dtype,
                                        page=PAGE if cache_dtype is None else 16)
    ref_cache = cache.clone()
    ref = _torch_backend(window, sinks, heads, kv_heads, dim).forward(q, k, v, ref_cache, meta)
    if window and cache_dtype is None:  # (an FP8 cache cannot hold NaN)
        _poison_freed_entries(cache, meta, window)
    triton = TritonAttentionBackend(heads, kv_heads, dim, dim ** -0.5, sliding_window=window)
    triton.sinks = sinks
    got = triton.forward(q, k, v, cache, meta)
    if splits is not None:  # decode with a forced split count (the backend picks 1 on the interpreter)
        got = paged_decode(q, cache, meta.block_tables, meta.seq_lens, dim ** -0.5, num_splits=splits,
                           window=window or 0, sinks=sinks)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


CASES = {
    "decode": ([5, 40, 1, 77], [1, 1, 1, 1]),
    "prefill": ([0, 0, 0], [3, 70, 17]),
    "chunk-after-prefix-hit": ([16, 24, 9, 40], [5, 40, 1, 30]),
    "mixed-step": ([300, 41, 0, 77, 16], [1, 1, 50, 1, 9]),
}


@pytest.mark.parametrize("window, with_sinks", [(WINDOW, False), (None, True), (WINDOW, True)])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_kernels_match_the_torch_backend_with_sinks_and_window(case, window, with_sinks):
    _triton_against_torch(*CASES[case], window, _sinks() if with_sinks else None)


@pytest.mark.parametrize("splits", [2, 5])
def test_split_context_decode_with_window_and_sinks_matches_the_torch_backend(splits):
    _triton_against_torch([300, 9, 150, 64], [1, 1, 1, 1], 40, _sinks(), splits=splits)


def test_window_and_sinks_with_a_gqa_group_of_seven():
    _triton_against_torch([12, 33, 0], [1, 20, 31], WINDOW, _sinks(8)[:7].repeat(2), heads=14, kv_heads=2, dim=16)


def test_window_longer_than_every_context_changes_nothing():
    _triton_against_torch([16, 24, 0], [5, 40, 17], 1000, None)


@pytest.mark.parametrize("case", ["decode", "chunk-after-prefix-hit"])
def test_window_and_sinks_over_an_fp8_cache_match_the_torch_backend(case):
    _triton_against_torch(*CASES[case], WINDOW, _sinks(), cache_dtype=FP8)


def test_fp8_dots_decode_with_window_and_sinks_stays_within_e4m3_rounding():
    """The FP8 tensor-core decode kernel (forced on the interpreter) over a window that starts mid-tile."""
    pytest.importorskip("triton")
    from railyard.engine.runner.kernels.paged_attention import paged_decode, store_kv

    heads, kv_heads, dim = 14, 2, 64
    q, k, v, cache, meta = random_batch([5, 40, 1, 200], [1] * 4, heads, kv_heads, dim, torch.float16, seed=3,
                                        cache_dtype=FP8, page=16)
    sinks = torch.linspace(-1.0, 2.0, heads, device=q.device)
    want = _torch_backend(70, sinks, heads, kv_heads, dim).forward(q, k, v, cache.clone(), meta).float()
    store_kv(cache, k, v, meta.slot_mapping)
    for splits in (1, 3):
        got = paged_decode(q, cache, meta.block_tables, meta.seq_lens, dim ** -0.5, num_splits=splits,
                           use_fp8_dots=True, window=70, sinks=sinks).float()
        assert ((got - want).norm() / want.norm()).item() < 0.045


def test_padded_decode_rows_with_sinks_return_zeros():
    pytest.importorskip("triton")
    from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend

    q, k, v, cache, meta = random_batch([10, 0], [1, 1], HEADS, KV_HEADS, DIM, torch.float32, seed=4)
    meta.slot_mapping[1] = -1
    meta.seq_lens[1] = 0
    triton = TritonAttentionBackend(HEADS, KV_HEADS, DIM, 0.2, sliding_window=WINDOW)
    triton.sinks = _sinks()
    out = triton.forward(q, k, v, cache, meta)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
