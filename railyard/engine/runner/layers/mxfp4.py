"""MXFP4 weights as gpt-oss checkpoints ship their experts (OCP microscaling, `quant_method: mxfp4`).

A row of K weights is stored as K / 32 groups: 16 bytes of e2m1 values (two a byte, the even element in the low
nibble) and one uint8 e8m0 exponent (the group's scale 2^(e - 127)). The experts keep these bytes as they are
(4.25 bits a weight); `dequantize_mxfp4` widens one expert's weights when it runs (the CPU reference path), as HF
transformers' dequantizer does (the same table and exponent arithmetic, so the same numbers).

On the GPU the experts keep the same bytes in the fused kernel's order (`to_kernel_layout`): within each group's 16
bytes, byte j moves to (j % 4) * 4 + j // 4. The tensor cores' register fragment hands each thread the bytes j = c,
c + 4, c + 8, c + 12 of a group (its pairs of K columns), which the checkpoint's order scatters, so the kernel read
them from shared memory one byte at a time; in this order they are one load.
"""

from __future__ import annotations

import torch

from railyard.model.spec import MXFP4_GROUP

GROUP = MXFP4_GROUP  # weights per shared exponent
# e2m1 code -> value (sign bit 3, then two exponent bits and one mantissa bit)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [..., K / 2] (or [..., K / 32, 16]) uint8 and scales [..., K / 32] uint8 -> weights [..., K]."""
    *lead, groups = scales.shape
    packed = blocks.reshape(*lead, groups, GROUP // 2)
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=blocks.device)
    values = torch.stack((table[(packed & 0x0F).long()], table[(packed >> 4).long()]), dim=-1)
    values = values.reshape(*lead, groups, GROUP)
    exponents = scales.to(torch.int32) - 127
    return torch.ldexp(values, exponents[..., None]).reshape(*lead, groups * GROUP)


def to_kernel_layout(blocks: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., K / 2] in checkpoint order -> the fused kernel's order (the module docstring), a new
    tensor of the same shape."""
    *lead, width = blocks.shape
    return blocks.reshape(*lead, width // 16, 4, 4).transpose(-1, -2).reshape(*lead, width)


def from_kernel_layout(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of to_kernel_layout: the fused kernel's order -> checkpoint order."""
    return to_kernel_layout(blocks)  # a 4 x 4 transpose is its own inverse


def quantize_mxfp4(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [..., K] (K a multiple of 32) -> (blocks [..., K / 32, 16], scales [..., K / 32]) as checkpoints
    hold them: each group's exponent puts its largest magnitude in [4, 8) (e2m1's top binade; beyond 6 it
    saturates, as the OCP spec's conversion does), each value rounded to the nearest e2m1 value."""
    *lead, k = weights.shape
    if k % GROUP:
        raise ValueError(f"MXFP4 rows must be a multiple of {GROUP} weights, got {k}")
    w = weights.float().reshape(*lead, k // GROUP, GROUP)
    amax = w.abs().amax(dim=-1, keepdim=True)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - 2,
                           torch.full_like(amax, -127.0)).clamp(-127, 127)
    scaled = w / torch.exp2(exponent)
    magnitudes = torch.tensor(E2M1_VALUES[:8])
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(dim=-1) | ((scaled < 0).long() << 3)
    codes = codes.to(torch.uint8).reshape(*lead, k // GROUP, GROUP // 2, 2)
    blocks = codes[..., 0] | (codes[..., 1] << 4)
    return blocks, (exponent[..., 0] + 127).to(torch.uint8)
