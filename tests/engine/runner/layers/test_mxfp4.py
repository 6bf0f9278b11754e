"""MXFP4 bytes: the checkpoint's nibble order and the experts' paired one the fused GEMM reads."""

from __future__ import annotations

import torch

from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, pair_nibbles, quantize_mxfp4, unpair_nibbles


def test_a_paired_group_holds_weights_j_and_16_plus_j_in_byte_j():
    codes = torch.arange(32, dtype=torch.uint8) % 16  # one group whose weight i has code i % 16
    checkpoint = (codes[0::2] | (codes[1::2] << 4))[None]  # byte j: weights 2j (low nibble), 2j + 1
    paired = pair_nibbles(checkpoint)[0]
    assert [(b & 15, b >> 4) for b in paired.tolist()] == [(j % 16, (16 + j) % 16) for j in range(16)]


def test_pairing_keeps_the_shape_and_unpairing_gives_the_checkpoint_bytes_back():
    blocks = torch.randint(0, 256, (3, 4, 5, 16), dtype=torch.uint8)  # [E, N, groups, 16] as checkpoints ship them
    paired = pair_nibbles(blocks)
    assert paired.shape == blocks.shape and torch.equal(unpair_nibbles(paired), blocks)
    flat = blocks.reshape(3, 4, 80)  # [E, N, K / 2]: the same bytes, the same pairing
    assert torch.equal(pair_nibbles(flat), paired.reshape(3, 4, 80))


def test_the_widened_weights_come_back_through_the_paired_bytes():
    weights = torch.randn(6, 64)
    blocks, scales = quantize_mxfp4(weights)
    widened = dequantize_mxfp4(blocks, scales, torch.float32)
    assert torch.equal(dequantize_mxfp4(unpair_nibbles(pair_nibbles(blocks)), scales, torch.float32), widened)
    assert (widened - weights).abs().max() < weights.abs().max() / 4  # e2m1: within a quarter of the group's top
