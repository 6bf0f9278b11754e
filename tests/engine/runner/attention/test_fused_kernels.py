"""The fused Triton elementwise kernels compute what the torch layers compute (same roundings).

GPU when there is one, else Triton's CPU interpreter; skipped where triton is not installed (CI).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import fused  # noqa: E402
from railyard.engine.runner.kernels import fused_ops  # noqa: E402
from railyard.engine.runner.layers import activation, norm, rotary  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's CPU interpreter rounds float32 -> bfloat16 by truncation; bf16 is checked on the GPU only.
DTYPES = [torch.float32, torch.float16,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="interpreter bf16 casts"))]


def _rand(*shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_the_torch_layer(dtype):
    layer = norm.RMSNorm(96, 1e-6).to(DEVICE, dtype)
    layer.weight.data = _rand(96, dtype=dtype, seed=3)
    x, res = _rand(5, 96, dtype=dtype, seed=1), _rand(5, 96, dtype=dtype, seed=2)
    want_out, want_res = layer.forward_native(x, res)
    got_out, got_res = fused.rms_norm(x, layer.weight, 1e-6, res)
    assert torch.equal(got_res, want_res)
    torch.testing.assert_close(got_out, want_out, atol=0, rtol=1e-2 if dtype != torch.float32 else 1e-6)


def test_rms_norm_of_strided_per_head_rows_matches_the_torch_layer():
    layer = norm.RMSNorm(16, 1e-6).to(DEVICE)
    qkv = _rand(7, 3 * 4 * 16, dtype=torch.float32)
    q = qkv[:, : 4 * 16].view(7, 4, 16)  # a strided view, as q of a fused QKV projection
    torch.testing.assert_close(fused.rms_norm(q, layer.weight, 1e-6), layer.forward_native(q))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_torch_function(dtype):
    x = _rand(3, 2 * 1500, dtype=dtype)
    torch.testing.assert_close(fused.silu_and_mul(x), activation.silu_and_mul_native(x))  # exp rounding may differ


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_swiglu_matches_the_torch_function(dtype):
    """gpt-oss's activation in one pass: gate and up spread past the clamps (limit 7), NaN passing through them."""
    x = _rand(5, 2 * 1200, dtype=torch.float32, seed=4) * 6
    x[0, 0] = x[0, 1200 + 1] = float("nan")  # a gate and an up
    x = x.to(dtype)
    got = fused.clamped_swiglu(x, 1.702, 7.0)
    want = activation.clamped_swiglu_native(x, 1.702, 7.0)
    assert got.isnan()[0, :2].tolist() == want.isnan()[0, :2].tolist() == [True, True]
    torch.testing.assert_close(got, want, equal_nan=True)  # exp rounding may differ


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # a short original length: all three wavelength bands occur


_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-for-bit equality (torch.equal alone would take -0.0 for 0.0)."""
    return (got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(got.contiguous().view(_BITS[got.dtype]), want.contiguous().view(_BITS[want.dtype])))


def _qkv_views(t, hq, hk, d, dtype, seed):
    """q, k as the decoder makes them: strided views of one [T, (Hq + 2Hk) * D] projection output.

    Magnitudes spread over several binades so that rounding once instead of per op shows.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (t, (hq + 2 * hk) * d)
    qkv = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())
    if t > 1:  # one token of signed zeros: x*cos + rotate_half(x)*sin must get the sign of zero right too
        qkv[1] = torch.where(torch.rand(shape[1], generator=g) < 0.5, 0.0, -0.0)
    qkv = qkv.to(dtype).to(DEVICE)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return qkv, q.view(t, hq, d), k.view(t, hk, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("t, hq, hk", [(1, 4, 4), (7, 8, 2), (19, 6, 1), (33, 48, 8)])
@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
def test_rotary_is_bit_exact_with_the_torch_layer(dtype, d, t, hq, hk, scaling):
    max_pos = 4096
    rope = rotary.RotaryEmbedding(d, max_pos, 500000.0, scaling).to(DEVICE)
    qkv, q, k = _qkv_views(t, hq, hk, d, dtype, seed=t * 131 + d)
    before = qkv.clone()
    positions = torch.randint(0, max_pos, (t,), generator=torch.Generator().manual_seed(d))  # unsorted
    positions[t // 2] = 0  # sin = 0: products of +-0
    positions = positions.to(DEVICE)
    want_q, want_k = rope.forward_native(positions, q, k)
    got_q, got_k = fused.rotary(positions, q, k, rope.cos, rope.sin)
    # Exact for every dtype: products and the sum are rounded to the dtype one torch op at a time, and the
    # launch disables FMA contraction, so float32 (no intermediate casts at all) is exact too.
    assert _same_bits(got_q, want_q) and _same_bits(got_k, want_k)
    assert got_q.is_contiguous() and got_k.is_contiguous()
    assert torch.equal(qkv, before)  # q and k of the projection output are left as they were


def test_rotary_oracle_tells_op_by_op_rounding_from_rounding_once():
    """The oracle is sensitive: float32 math rounded once per output differs from torch's op-by-op rounding."""
    rope = rotary.RotaryEmbedding(128, 4096, 500000.0, LLAMA3).to(DEVICE)
    _, q, k = _qkv_views(33, 48, 8, 128, torch.float16, seed=5)
    positions = torch.randint(0, 4096, (33,), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    cos = rope.cos[positions].to(q.dtype).float().unsqueeze(1)
    sin = rope.sin[positions].to(q.dtype).float().unsqueeze(1)
    qf = q.float()
    once = (qf * cos + torch.cat((-qf[..., 64:], qf[..., :64]), dim=-1) * sin).to(q.dtype)
    got_q, _ = fused.rotary(positions, q, k, rope.cos, rope.sin)
    assert not torch.equal(once, got_q)
    assert _same_bits(got_q, rope.forward_native(positions, q, k)[0])


def test_rotary_of_no_tokens():
    rope = rotary.RotaryEmbedding(64, 16, 10000.0, None).to(DEVICE)
    _, q, k = _qkv_views(0, 4, 2, 64, torch.float16, seed=0)
    got_q, got_k = fused.rotary(torch.zeros(0, dtype=torch.long, device=DEVICE), q, k, rope.cos, rope.sin)
    assert got_q.shape == (0, 4, 64) and got_k.shape == (0, 2, 64)


@pytest.mark.skipif(DEVICE == "cpu", reason="the layer takes the fused path on CUDA tensors only")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_layer_with_fused_kernels_on_is_bit_exact_on_the_gpu(dtype):
    fused_ops.cache_clear()
    try:
        assert fused_ops() is fused
        rope = rotary.RotaryEmbedding(128, 8192, 500000.0, {**LLAMA3, "original_max_position_embeddings": 8192})
        rope = rope.to(DEVICE)
        _, q, k = _qkv_views(64, 32, 8, 128, dtype, seed=9)
        positions = torch.randperm(8192, generator=torch.Generator().manual_seed(2))[:64].to(DEVICE)
        got_q, got_k = rope(positions, q, k)
        want_q, want_k = rope.forward_native(positions, q, k)
        assert _same_bits(got_q, want_q) and _same_bits(got_k, want_k)
    finally:
        fused_ops.cache_clear()
