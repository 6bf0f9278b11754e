"""SiLU-and-mul over a fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from railyard.engine.kernels import fused_ops


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda and fused_ops() is not None:
        return fused_ops().silu_and_mul(x)
    return silu_and_mul_native(x)


def silu_and_mul_native(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
