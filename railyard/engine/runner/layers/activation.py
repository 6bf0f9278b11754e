"""SiLU-and-mul over a fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from railyard.engine.runner.kernels import fused_ops
from railyard.engine.runner.layers.fp8 import QuantizedActivation


def silu_and_mul(x: torch.Tensor, quantize_output: bool = False) -> torch.Tensor | QuantizedActivation:
    """silu(gate) * up of x [T, 2I]. quantize_output (only an FP8 linear layer reads the result): on the GPU the
    fused kernel quantizes it per token in the same pass and returns a QuantizedActivation."""
    if x.is_cuda and fused_ops() is not None:
        if quantize_output and x.dim() == 2:
            return QuantizedActivation(*fused_ops().silu_and_mul_quant(x), x.dtype)
        return fused_ops().silu_and_mul(x)
    return silu_and_mul_native(x)


def silu_and_mul_native(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
