"""Widening MXFP4 experts on the GPU for one large step: the same numbers as the layer's CPU dequantizer (HF
transformers' arithmetic), for every code and exponent, rows and widths that end inside a program's tile, in the
model's dtypes. On the GPU when there is one, else in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels.mxfp4_widen import widen_mxfp4  # noqa: E402
from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, to_kernel_layout  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("kernel_layout", [False, True], ids=["checkpoint-order", "kernel-order"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("lead", "k"), [((3, 5), 96), ((1, 17), 544), ((2, 1), 32)],
                         ids=["experts-x-rows", "past-one-tile", "one-group"])
def test_widened_weights_are_the_dequantizers_bit_for_bit(dtype, lead, k, kernel_layout):
    """Random bytes (every code in both nibbles) under exponents 2^-17..2^10, and in float32 e8m0's 0 (2^-127,
    whose products are float32 subnormals; in bf16 Triton's CPU interpreter flushes those): the kernel's values
    equal dequantize_mxfp4's exactly, shape [..., K], from bytes in checkpoint order or in the fused kernel's."""
    gen = torch.Generator().manual_seed(k)
    packed = torch.randint(0, 256, (*lead, k // 2), generator=gen).to(torch.uint8)
    exponents = torch.randint(110, 138, (*lead, k // 32), generator=gen).to(torch.uint8)
    if dtype == torch.float32:
        exponents.view(-1)[0] = 0
    want = dequantize_mxfp4(packed, exponents, dtype)
    stored = to_kernel_layout(packed) if kernel_layout else packed
    got = widen_mxfp4(stored.to(DEVICE), exponents.to(DEVICE), dtype, kernel_layout)
    assert got.shape == (*lead, k) and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_exponents_that_do_not_match_the_packed_weights_are_refused():
    packed = torch.zeros((2, 4, 48), dtype=torch.uint8)
    with pytest.raises(ValueError, match="exponents"):
        widen_mxfp4(packed, torch.zeros((2, 4, 2), dtype=torch.uint8), torch.bfloat16)
