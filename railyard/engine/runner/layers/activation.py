"""The gated activations over a fused gate/up projection: SiLU-and-mul, and gpt-oss's clamped SwiGLU."""

from __future__ import annotations

from dataclasses import dataclass

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


def clamped_swiglu(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation, [n, 2I] (gate half, then up half) -> [n, I]: (clamp(up, +-limit) + 1) * g *
    sigmoid(alpha * g) where g = min(gate, limit). On the GPU one fused kernel (one read, one write, where the torch
    form makes seven passes over [n, I] tensors), rounded op by op as the torch form rounds."""
    if x.is_cuda and x.dim() == 2 and fused_ops() is not None:
        return fused_ops().clamped_swiglu(x, alpha, limit)
    return clamped_swiglu_native(x, alpha, limit)


@dataclass(frozen=True)
class ClampedSwiGLU:
    """clamped_swiglu with gpt-oss's constants, as the activation a layer holds: the fused-MoE kernel recognises it
    and applies it in the gate/up GEMM's epilogue (experts other than FP8: their [n, 2I] gate/up output is never
    written)."""

    alpha: float
    limit: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(x, self.alpha, self.limit)


def clamped_swiglu_native(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """clamped_swiglu in torch, in HF transformers' order of operations."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
