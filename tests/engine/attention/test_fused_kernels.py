"""The fused Triton elementwise kernels compute what the torch layers compute (same roundings).

GPU when there is one, else Triton's CPU interpreter; skipped where triton is not installed (CI).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.kernels import fused  # noqa: E402
from railyard.engine.layers import activation, norm  # noqa: E402

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
