"""Triton per-token FP8 quantization of activations (the GPU path of layers.fp8.quantize_per_token).

In torch the same thing is five or six passes over the activations (float cast, abs, amax, divide,
clamp, cast); before a down projection of a 16k-token prefill step those are gigabytes of traffic
next to the GEMM itself. One program per token row: the row's absolute maximum, then the row divided
by its scale and cast, in one read (rows up to 4096 wide) or two. Divisions round to nearest
(div_rn) as torch's do, so the result is bit-identical to quantize_per_token_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_FP8_MAX = 448.0
_MIN_SCALE = 1e-12
_MAX_BLOCK = 4096


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, x_stride, N: tl.constexpr, BLOCK: tl.constexpr,
                            ONE_PASS: tl.constexpr, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * x_stride
    q_row = q_ptr + row * N
    if ONE_PASS:
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), 0)
    else:
        run = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
            run = tl.maximum(run, tl.abs(x))
        amax = tl.max(run, 0)
    scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row, scale)
    if ONE_PASS:
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_row + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
            tl.store(q_row + c, q.to(q_ptr.dtype.element_ty), mask=c < N)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit last stride) -> (q [M, K] float8_e4m3fn contiguous, scale [M, 1] float32)."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"quantize_per_token wants a 2-D input with unit last stride, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    block = min(triton.next_power_of_2(k), _MAX_BLOCK)
    _per_token_quant_kernel[(m,)](x, q, scale, x.stride(0), N=k, BLOCK=block, ONE_PASS=block >= k,
                                  FP8_MAX=_FP8_MAX, MIN_SCALE=_MIN_SCALE, num_warps=4 if block <= 2048 else 8)
    return q, scale
