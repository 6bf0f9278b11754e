"""RMSNorm, matching HF transformers' numerics (normalise in float32, scale in the input dtype)."""

from __future__ import annotations

import torch
from torch import nn

from railyard.engine.kernels import fused_ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalise x (after adding residual, if given); returns (out, new_residual) when residual is given."""
        if x.is_cuda and fused_ops() is not None:  # one fused pass instead of ~8 (GPU profile)
            return fused_ops().rms_norm(x, self.weight, self.eps, residual)
        return self.forward_native(x, residual)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The plain torch version (CPU, and the oracle of the fused kernel)."""
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)
