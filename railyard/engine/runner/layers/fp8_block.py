"""Block-wise FP8: e4m3 weights with one float32 scale per EXPERT_BLOCK (128 output x 128 input weights), and
activations with one scale per token and 128-wide group of its features (the block's input width), as FP8 MoE
checkpoints (Qwen3-30B-A3B-FP8: quant_method fp8, weight_block_size [128, 128]) and DeepSeek-V3's recipe use them.

A weight's scale rows may restart part-way down its rows: the experts' fused gate/up stacks the gate's blocks over
the up's, each projection padded to whole blocks on its own (`split`, the rows of one projection), so that a
shard narrower than a block (a tiny model, a wide tensor-parallel split) still has its own scales. The numbers
follow layers/fp8.py's one recipe (amax times the float32 reciprocal of 448, a rounded division, e4m3 rounding to
nearest even), so torch and the Triton kernels make the same bytes.
"""

from __future__ import annotations

import torch

from railyard.engine.runner.layers.fp8 import scales_of, to_fp8
from railyard.model.spec import EXPERT_BLOCK


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_scale_shape(rows: int, cols: int, split: int | None = None) -> tuple[int, int]:
    """The scales of a [rows, cols] weight whose rows are projections of `split` rows each (None: one)."""
    split = split or rows
    return rows // split * _cdiv(split, EXPERT_BLOCK[0]), _cdiv(cols, EXPERT_BLOCK[1])


def scale_index(rows: int, cols: int, split: int | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each weight row and column, the row and column of its scale."""
    split = split or rows
    bn, bk = EXPERT_BLOCK
    r = torch.arange(rows, device=device)
    return (r // split) * _cdiv(split, bn) + (r % split) // bn, torch.arange(cols, device=device) // bk


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] e4m3, scale [ceil(N/128), ceil(K/128)] float32): one scale per 128 x 128 block."""
    n, k = w.shape
    bn, bk = EXPERT_BLOCK
    nb, kb = _cdiv(n, bn), _cdiv(k, bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.view(nb, bn, kb, bk)
    scale = scales_of(blocks.abs().amax(dim=(1, 3)))
    q = to_fp8(blocks * scale.reciprocal()[:, None, :, None]).view(nb * bn, kb * bk)[:n, :k]
    return q.contiguous(), scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                      split: int | None = None) -> torch.Tensor:
    """q [..., N, K] e4m3 with its block scales [..., nb, kb] -> [..., N, K] in dtype (the reference path)."""
    rows, cols = scale_index(q.shape[-2], q.shape[-1], split, q.device)
    full = scale[..., rows, :][..., cols]
    return (q.float() * full).to(dtype)


def quantize_per_token_group(x: torch.Tensor, group: int = EXPERT_BLOCK[1]) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, ceil(K/group)] float32): one scale per token and group of features."""
    m, k = x.shape
    g = _cdiv(k, group)
    padded = torch.zeros(m, g * group, dtype=torch.float32, device=x.device)
    padded[:, :k] = x.float()
    groups = padded.view(m, g, group)
    scale = scales_of(groups.abs().amax(dim=-1))
    q = to_fp8(groups * scale.reciprocal()[..., None]).view(m, g * group)[:, :k]
    return q.contiguous(), scale


def dequantize_per_token_group(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                               group: int = EXPERT_BLOCK[1]) -> torch.Tensor:
    """quantize_per_token_group's inverse: q [M, K] times its group's scale, in dtype."""
    cols = torch.arange(q.shape[-1], device=q.device) // group
    return (q.float() * scale[:, cols]).to(dtype)
