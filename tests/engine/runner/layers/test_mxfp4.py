"""MXFP4 weights: quantized as checkpoints hold them and widened back."""

from __future__ import annotations

import torch

from railyard.engine.runner.layers.mxfp4 import (dequantize_mxfp4, from_kernel_layout, quantize_mxfp4,
                                                 to_kernel_layout)


def test_quantized_weights_widen_back_to_within_e2m1s_step():
    weights = torch.randn(6, 64)
    blocks, scales = quantize_mxfp4(weights)
    widened = dequantize_mxfp4(blocks, scales, torch.float32)
    assert (widened - weights).abs().max() < weights.abs().max() / 4  # e2m1: within a quarter of the group's top


def test_the_kernel_layout_puts_the_bytes_one_mma_lane_reads_side_by_side_in_each_group():
    """Byte j of a 16-byte group moves to (j % 4) * 4 + j // 4: a lane's bytes c, c + 4, c + 8, c + 12 become four
    neighbours; groups stay where they were, and from_kernel_layout puts every byte back."""
    blocks = torch.arange(2 * 48, dtype=torch.int64).reshape(2, 48).to(torch.uint8)
    arranged = to_kernel_layout(blocks)
    assert arranged[0, :16].tolist() == [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]
    assert sorted(arranged[1, 16:32].tolist()) == list(range(64, 80))  # the second group's own bytes
    assert torch.equal(from_kernel_layout(arranged), blocks)
