"""The torch reference backend over an FP8 (or bf16) KV cache: what it stores and what it attends over.

Oracles: torch's float8_e4m3fn / bfloat16 conversion for the stored bytes, and a dense float64
causal softmax attention over the cache's dequantized contents (cached values * scale) for the output.
Runs on CI (no triton needed).
"""

from __future__ import annotations

import pytest
import torch

from railyard.engine.runner.attention.kv_layout import key_blocks, value_blocks
from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
from railyard.engine.runner.layers.fp8 import FP8
from tests.engine.runner.attention.paged_batch import DEVICE, PAGE, random_batch

HEADS, KV_HEADS, DIM = 4, 2, 32
TOL = 1e-5 if DEVICE == "cpu" else 1e-4  # CUDA's float32 attention kernels sum in other orders


def _slots(cache: torch.Tensor, meta, plane: int) -> torch.Tensor:
    """The cache entries at the step's slots, [T, kv_heads, dim], as raw bytes for FP8."""
    blocks = (key_blocks, value_blocks)[plane](cache)
    return blocks[meta.slot_mapping // PAGE, meta.slot_mapping % PAGE]


def _dense_oracle(q, cache, meta, scale, k_scale, v_scale) -> torch.Tensor:
    """Causal attention in float64 over each sequence's dequantized cached keys/values (on the CPU)."""
    q, cache = q.cpu(), cache.cpu()
    out = torch.empty(q.shape, dtype=torch.float64)
    starts = meta.query_start_loc_cpu
    groups = HEADS // KV_HEADS
    for i, seq_len in enumerate(meta.seq_lens_cpu):
        table = meta.block_tables[i].tolist()
        pos = torch.arange(seq_len)
        rows = torch.tensor([table[p // PAGE] * PAGE + p % PAGE for p in pos.tolist()])
        keys = key_blocks(cache).flatten(0, 1)[rows].view(cache.dtype).double() * k_scale  # [L, hk, d]
        values = value_blocks(cache).flatten(0, 1)[rows].view(cache.dtype).double() * v_scale
        s, e = starts[i], starts[i + 1]
        qi = q[s:e].double()  # [n, H, d]
        kh = keys.repeat_interleave(groups, dim=1)
        vh = values.repeat_interleave(groups, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", qi, kh) * scale
        q_pos = torch.arange(seq_len - (e - s), seq_len)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[s:e] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), vh)
    return out


CASES = {
    "decode": ([5, 40, 1, 77], [1, 1, 1, 1]),
    "prefill": ([0, 0, 0], [3, 70, 17]),
    "prefill after prefix hits": ([16, 24, 9], [5, 40, 1]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.25, 4.0)])
def test_fp8_cache_holds_keys_and_values_divided_by_their_scales(case, k_scale, v_scale):
    q, k, v, cache, meta = random_batch(*CASES[case], HEADS, KV_HEADS, DIM, torch.float32, seed=1, cache_dtype=FP8)
    k[0, 0, :3] = torch.tensor([1e4, -1e4, 500.0], device=k.device)  # beyond e4m3's range once divided: saturates, no NaN
    attn = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    attn.k_scale, attn.v_scale = k_scale, v_scale
    attn.forward(q, k, v, cache, meta)
    want_k = (k / k_scale).clamp(-448, 448).to(FP8).view(torch.uint8)
    want_v = (v / v_scale).clamp(-448, 448).to(FP8).view(torch.uint8)
    assert torch.equal(_slots(cache, meta, 0), want_k) and torch.equal(_slots(cache, meta, 1), want_v)
    assert torch.isfinite(cache.float()).all()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.25, 4.0)])
def test_attention_over_an_fp8_cache_is_attention_over_its_dequantized_values(case, k_scale, v_scale):
    q, k, v, cache, meta = random_batch(*CASES[case], HEADS, KV_HEADS, DIM, torch.float32, seed=2, cache_dtype=FP8)
    attn = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    attn.k_scale, attn.v_scale = k_scale, v_scale
    got = attn.forward(q, k, v, cache, meta)
    want = _dense_oracle(q, cache, meta, DIM ** -0.5, k_scale, v_scale)
    torch.testing.assert_close(got.double().cpu(), want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bf16_cache_under_a_float32_model_rounds_once_on_store(case):
    q, k, v, cache, meta = random_batch(*CASES[case], HEADS, KV_HEADS, DIM, torch.float32, seed=3,
                                        cache_dtype=torch.bfloat16)
    got = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5).forward(q, k, v, cache, meta)
    assert torch.equal(_slots(cache, meta, 0), k.to(torch.bfloat16))
    assert torch.equal(_slots(cache, meta, 1), v.to(torch.bfloat16))
    torch.testing.assert_close(got.double().cpu(), _dense_oracle(q, cache, meta, DIM ** -0.5, 1.0, 1.0),
                               atol=TOL, rtol=TOL)


def test_checkpoint_kv_scales_do_not_touch_a_cache_that_is_not_fp8():
    q, k, v, cache, meta = random_batch(*CASES["prefill after prefix hits"], HEADS, KV_HEADS, DIM, torch.float32,
                                        seed=4)
    plain = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    scaled = TorchAttentionBackend(HEADS, KV_HEADS, DIM, DIM ** -0.5)
    scaled.k_scale, scaled.v_scale = 0.25, 4.0
    c1, c2 = cache.clone(), cache.clone()
    assert torch.equal(plain.forward(q, k, v, c1, meta), scaled.forward(q, k, v, c2, meta))
    assert torch.equal(c1, c2)
