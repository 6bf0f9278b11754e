"""RMSNorm, matching HF transformers' numerics (normalise in float32, scale in the input dtype)."""

from __future__ import annotations

import torch
from torch import nn

from railyard.engine.runner.kernels import fused_ops
from railyard.engine.runner.layers.fp8 import QuantizedActivation, ScaledAccumulator


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, quantize_output: bool = False) -> None:
        """quantize_output: only an FP8 linear layer reads the output, so on the GPU the fused kernel hands it a
        QuantizedActivation (kernels/fused.py's rms_norm_quant) instead of a tensor it would quantize itself."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.quantize_output = quantize_output

    def forward(self, x: torch.Tensor | ScaledAccumulator, residual: torch.Tensor | None = None):
        """Normalise x (after adding residual, if given); returns (out, new_residual) when residual is given.

        x may be an FP8 GEMM's ScaledAccumulator (layers/fp8.py): the fused kernel applies its scales as it reads
        it, saving the scales pass's launch and its output's round trip; elsewhere they are applied first."""
        scales, dtype = None, x.dtype
        if isinstance(x, ScaledAccumulator):
            ops = fused_ops() if x.acc.is_cuda else None
            if ops is not None and dtype in ops.SCALED_DTYPES:
                x, scales = x.acc, (x.x_scale, x.weight_scale)
            else:
                x = x.materialize()
        if x.is_cuda and fused_ops() is not None:  # one fused pass instead of ~8 (GPU profile)
            if self.quantize_output and x.dim() == 2 and x.shape[-1] <= fused_ops().QUANT_MAX_WIDTH:
                got = fused_ops().rms_norm_quant(x, self.weight, self.eps, residual, scales)
                if residual is None:
                    return QuantizedActivation(*got, dtype)
                return QuantizedActivation(*got[0], dtype), got[1]
            return fused_ops().rms_norm(x, self.weight, self.eps, residual, scales)
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
