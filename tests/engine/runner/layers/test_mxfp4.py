"""MXFP4 weights: quantized as checkpoints hold them and widened back."""

from __future__ import annotations

import torch

from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, quantize_mxfp4


def test_quantized_weights_widen_back_to_within_e2m1s_step():
    weights = torch.randn(6, 64)
    blocks, scales = quantize_mxfp4(weights)
    widened = dequantize_mxfp4(blocks, scales, torch.float32)
    assert (widened - weights).abs().max() < weights.abs().max() / 4  # e2m1: within a quarter of the group's top
