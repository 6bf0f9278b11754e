"""The norm and SiLU-and-mul kernels that quantize their own output for an FP8 linear layer write exactly the
bytes the unfused composition writes: the fused kernel's output in the model dtype, then the per-token
quantization kernel over it (kernels/fp8.py, itself bit for bit layers/fp8.py's torch recipe).
The norm that also applies an unscaled FP8 GEMM's scales (after the o and down projections) writes what
apply_scales and then the norm write.

GPU when there is one, else Triton's CPU interpreter (conftest.py); skipped where triton is not installed (CI).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import fp8 as fp8_kernels  # noqa: E402
from railyard.engine.runner.kernels import fused  # noqa: E402
from railyard.engine.runner.layers.fp8 import FP8, apply_scales_ref  # noqa: E402
from tests.engine.runner.attention.paged_batch import DEVICE  # noqa: E402

# The interpreter's float32 -> bfloat16 cast truncates; bf16 inputs are checked on the GPU only.
DTYPES = [torch.float32, torch.float16,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="interpreter bf16 casts"))]


def _rows(t: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """t rows of width d, their magnitudes decades apart (1e-3 to 10: float16 products stay finite), row 2 all
    zero (a padded row)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((t, d), generator=g) * torch.logspace(-3, 1, t)[:, None]
    x[2] = 0.0
    return x.to(dtype).to(DEVICE)


def _weight(d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.rand(d, generator=torch.Generator().manual_seed(seed)) + 0.5).to(dtype).to(DEVICE)


def _same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    (q, s), (want_q, want_s) = got, want
    return (q.dtype == FP8 and q.shape == want_q.shape and s.shape == want_s.shape and torch.equal(s, want_s)
            and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [96, 3584])  # a 7B hidden size: not a power of two
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_quant_is_the_per_token_quantization_of_rms_norm(dtype, d, with_residual):
    x, w = _rows(6, d, dtype, seed=d), _weight(d, dtype, seed=d + 1)
    res = _rows(6, d, dtype, seed=d + 2) if with_residual else None
    if res is not None:
        res[2] = 0.0  # the padded row stays zero after the residual add
    got = fused.rms_norm_quant(x, w, 1e-6, res)
    want = fused.rms_norm(x, w, 1e-6, res)
    if with_residual:
        assert torch.equal(got[1], want[1])  # the new residual, as rms_norm returns it
        got, want = got[0], want[0]
    assert _same(got, fp8_kernels.quantize_per_token_triton(want))


def test_rms_norm_quant_reads_strided_rows():
    x = _rows(5, 2 * 96, torch.float32, seed=3)[:, :96]  # row stride 192, as a view into a wider activation
    w = _weight(96, torch.float32, seed=4)
    assert _same(fused.rms_norm_quant(x, w, 1e-5), fp8_kernels.quantize_per_token_triton(fused.rms_norm(x, w, 1e-5)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [96, 5000, fused.SILU_QUANT_ONE_PASS_MAX + 100])  # one pass, and two over blocks
def test_silu_and_mul_quant_is_the_per_token_quantization_of_silu_and_mul(dtype, n):
    x = _rows(5, 2 * n, dtype, seed=n)
    assert _same(fused.silu_and_mul_quant(x), fp8_kernels.quantize_per_token_triton(fused.silu_and_mul(x)))


def test_silu_and_mul_quant_reads_strided_rows():
    x = _rows(4, 3 * 200, torch.float32, seed=5)[:, :400]  # gate | up inside a wider row
    assert _same(fused.silu_and_mul_quant(x), fp8_kernels.quantize_per_token_triton(fused.silu_and_mul(x)))


def test_fused_quantization_of_no_tokens():
    x = torch.empty((0, 96), device=DEVICE)
    (q, s), res = fused.rms_norm_quant(x, torch.ones(96, device=DEVICE), 1e-6, torch.empty((0, 96), device=DEVICE))
    assert q.shape == (0, 96) and s.shape == (0, 1) and res.shape == (0, 96)
    q, s = fused.silu_and_mul_quant(torch.empty((0, 192), device=DEVICE))
    assert q.shape == (0, 96) and s.shape == (0, 1)


@pytest.mark.skipif(DEVICE == "cpu", reason="the layers take the fused path on CUDA tensors only")
def test_the_layers_hand_an_fp8_linear_layer_what_it_would_compute_itself_on_the_gpu():
    from railyard.engine.runner.layers.activation import silu_and_mul
    from railyard.engine.runner.layers.fp8 import QuantizedActivation, fp8_linear, quantize_rows
    from railyard.engine.runner.layers.norm import RMSNorm

    x, res = _rows(33, 3584, torch.bfloat16, seed=6), _rows(33, 3584, torch.bfloat16, seed=7)
    w, w_scale = quantize_rows(_rows(256, 3584, torch.float32, seed=8) * 0.02)
    fused_norm, plain_norm = RMSNorm(3584, 1e-6, quantize_output=True), RMSNorm(3584, 1e-6)
    plain_norm.weight.data = fused_norm.weight.data = _weight(3584, torch.bfloat16, seed=9)
    (got, got_res), (want, want_res) = fused_norm(x, res), plain_norm(x, res)
    assert isinstance(got, QuantizedActivation) and torch.equal(got_res, want_res)
    assert torch.equal(fp8_linear(got, w, w_scale), fp8_linear(want, w, w_scale))
    gate_up = _rows(33, 2 * 3584, torch.bfloat16, seed=10)
    got = silu_and_mul(gate_up, quantize_output=True)
    assert isinstance(got, QuantizedActivation)
    assert torch.equal(fp8_linear(got, w, w_scale), fp8_linear(silu_and_mul(gate_up), w, w_scale))


# The model dtypes the norm takes an unscaled GEMM's sums in (fused.SCALED_DTYPES); bf16 on the GPU only.
SCALED_DTYPES = DTYPES[1:]


def _unscaled_sums(t: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(acc [t, d] float32, x_scale [t, 1], weight_scale [d]) as an unscaled FP8 GEMM leaves them: large sums of
    e4m3 products, small scales; row 2 all zero (a padded row)."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn((t, d), generator=g) * 3e4
    acc[2] = 0.0
    xs = torch.rand((t, 1), generator=g) * 0.05 + 1e-4
    ws = torch.rand(d, generator=g) * 1e-4 + 1e-6
    return acc.to(DEVICE), xs.to(DEVICE), ws.to(DEVICE)


@pytest.mark.parametrize("dtype", SCALED_DTYPES)
@pytest.mark.parametrize("d", [96, 3584, 5000])  # 5000: wider than rms_norm_quant takes (QUANT_MAX_WIDTH)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("quant", [False, True])
def test_the_norm_of_unscaled_sums_is_apply_scales_then_the_norm(dtype, d, with_residual, quant):
    """The o and down projections' scales pass fused into the norm after them: the same bytes (output, scales of
    the quantized output, new residual) as layers.fp8.apply_scales_ref and then the norm kernel."""
    if quant and d > fused.QUANT_MAX_WIDTH:
        pytest.skip("rms_norm_quant holds a row in registers; wider rows go through rms_norm")
    acc, xs, ws = _unscaled_sums(6, d, seed=d)
    w = _weight(d, dtype, seed=d + 1)
    res = _rows(6, d, dtype, seed=d + 2) if with_residual else None
    norm = fused.rms_norm_quant if quant else fused.rms_norm
    got = norm(acc, w, 1e-6, res, scales=(xs, ws))
    want = norm(apply_scales_ref(acc, xs, ws, None, dtype), w, 1e-6, res)
    if with_residual:
        assert torch.equal(got[1], want[1])
        got, want = got[0], want[0]
    if quant:
        assert _same(got, want)
    else:
        assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.skipif(DEVICE == "cpu", reason="the layers take the fused path on CUDA tensors only")
@pytest.mark.parametrize("quantize_output", [False, True])
def test_the_norm_layer_applies_a_scaled_accumulators_scales_as_apply_scales_on_the_gpu(quantize_output):
    from railyard.engine.runner.layers.fp8 import QuantizedActivation, ScaledAccumulator, apply_scales
    from railyard.engine.runner.layers.norm import RMSNorm

    acc, xs, ws = _unscaled_sums(33, 3584, seed=11)
    res = _rows(33, 3584, torch.bfloat16, seed=12)
    norm = RMSNorm(3584, 1e-6, quantize_output=quantize_output)
    norm.weight.data = _weight(3584, torch.bfloat16, seed=13)
    (got, got_res), (want, want_res) = (norm(ScaledAccumulator(acc, xs, ws, torch.bfloat16), res),
                                        norm(apply_scales(acc, xs, ws, None, torch.bfloat16), res))
    assert torch.equal(got_res, want_res)
    if quantize_output:
        assert isinstance(got, QuantizedActivation) and got.dtype == torch.bfloat16
        assert _same((got.q, got.scale), (want.q, want.scale))
    else:
        assert torch.equal(got, want)
