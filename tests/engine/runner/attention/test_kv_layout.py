"""An FP8 cache keeps each block's values tokens innermost ([kv_heads, head_dim, block_size]); keys, and every
other cache's values, sit token-major. Both backends write and read that layout and agree at every block size.

The Triton half runs on the GPU when there is one, else in Triton's CPU interpreter (conftest.py); the layout
half (torch backend and views) runs everywhere.
"""

from __future__ import annotations

import pytest
import torch

from railyard.engine.runner.attention.kv_layout import key_blocks, value_blocks, values_tokens_inner
from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend, write_kv
from railyard.engine.runner.layers.fp8 import FP8
from tests.engine.runner.attention.paged_batch import random_batch

HEADS, KV_HEADS, DIM = 4, 2, 32


def test_fp8_values_lie_tokens_innermost_in_each_block_and_keys_token_major():
    nb, bs = 3, 8
    cache = torch.zeros((2, nb, bs, KV_HEADS, DIM), dtype=FP8)
    k = torch.randn((2, KV_HEADS, DIM))
    v = torch.randn((2, KV_HEADS, DIM))
    write_kv(cache, k, v, torch.tensor([13, 2]))  # block 1 token 5, block 0 token 2
    raw = cache.view(torch.uint8)
    for row, (block, token) in enumerate([(1, 5), (0, 2)]):
        assert torch.equal(raw[0, block, token], k[row].to(FP8).view(torch.uint8))
        assert torch.equal(raw[1].reshape(nb, KV_HEADS, DIM, bs)[block, :, :, token], v[row].to(FP8).view(torch.uint8))
        assert torch.equal(value_blocks(cache)[block, token], v[row].to(FP8).view(torch.uint8))
        assert torch.equal(key_blocks(cache)[block, token], k[row].to(FP8).view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_caches_keep_the_shape_s_layout_and_the_views_are_the_planes_themselves(dtype):
    cache = torch.randn((2, 3, 8, KV_HEADS, DIM)).to(dtype)
    assert not values_tokens_inner(cache)
    assert value_blocks(cache).data_ptr() == cache[1].data_ptr() and value_blocks(cache).stride() == cache[1].stride()
    assert torch.equal(key_blocks(cache), cache[0])


def test_writing_through_value_blocks_writes_the_fp8_cache():
    cache = torch.zeros((2, 2, 16, KV_HEADS, DIM), dtype=FP8)
    value_blocks(cache)[1, 3, 1, 7] = 0x38  # e4m3 1.0
    assert cache[1].view(torch.uint8).reshape(2, KV_HEADS, DIM, 16)[1, 1, 7, 3].item() == 0x38
    assert cache.float().sum().item() == 1.0


triton = pytest.importorskip("triton")

from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from railyard.engine.runner.kernels.paged_attention import paged_decode  # noqa: E402

CASES = {"decode": ([5, 40, 1, 77], [1, 1, 1, 1]), "prefill after prefix hits": ([16, 24, 0], [5, 40, 17])}


@pytest.mark.parametrize("page", [8, 16, 32])
@pytest.mark.parametrize("case", list(CASES))
def test_the_triton_kernels_store_and_read_the_layout_the_torch_backend_does_at_every_block_size(page, case):
    q, k, v, cache, meta = random_batch(*CASES[case], HEADS, KV_HEADS, DIM, torch.float32, seed=page, cache_dtype=FP8,
                                        page=page)
    ref_cache, got_cache = cache.clone(), cache.clone()
    torch_attn = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    triton_attn = TritonAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    for attn in (torch_attn, triton_attn):
        attn.k_scale, attn.v_scale = 0.5, 2.0
    want = torch_attn.forward(q, k, v, ref_cache, meta)
    got = triton_attn.forward(q, k, v, got_cache, meta)
    assert torch.equal(got_cache.view(torch.uint8), ref_cache.view(torch.uint8))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_nan_bytes_past_a_sequence_s_end_in_its_last_block_never_reach_the_output(case):
    """Whole blocks of values are read at once; the tokens past a sequence's end in its last block (stale bytes of an
    earlier owner, here e4m3 NaN) count as zero."""
    q, k, v, cache, meta = random_batch(*CASES[case], HEADS, KV_HEADS, DIM, torch.float32, seed=7, cache_dtype=FP8,
                                        page=16)
    clean = cache.clone()
    want = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5).forward(q, k, v, clean, meta)
    raw_values = value_blocks(cache)
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        last = meta.block_tables[i, (seq_len - 1) // 16].item()
        raw_values[last, seq_len % 16 or 16:] = 0x7F  # e4m3fn NaN
        key_blocks(cache)[last, seq_len % 16 or 16:] = 0x7F
    got = TritonAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5).forward(q, k, v, cache, meta)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_decode_tile_that_is_not_whole_blocks_of_an_fp8_cache_is_refused():
    q, k, v, cache, meta = random_batch([40], [1], HEADS, KV_HEADS, DIM, torch.float32, seed=1, cache_dtype=FP8,
                                        page=32)
    with pytest.raises(ValueError, match="multiple of its 32-token blocks"):
        paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1, block_n=16)
