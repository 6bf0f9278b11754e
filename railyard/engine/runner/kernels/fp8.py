"""Triton FP8 pieces: per-token quantization of activations (the GPU path of layers.fp8.quantize_per_token),
the scales-and-bias pass after an unscaled cuBLASLt GEMM (layers.fp8.apply_scales) and the float32 -> e4m3
rounding every FP8 kernel here uses (the store-KV kernel too).

In torch the per-token quantization is five or six passes over the activations (float cast, abs, amax,
scale, clamp, cast); before a down projection of a 16k-token prefill step those are gigabytes of traffic
next to the GEMM itself. One program per token row: the row's absolute maximum, then the row times the
reciprocal of its scale, clamped and cast, in one read (rows up to 4096 wide) or two.

Bit for bit what torch computes (layers.fp8's recipe, in the same IEEE float32 operations): scale =
max(amax * fl(1/448), MIN_SCALE), inv = div_rn(1, scale), q = e4m3(clamp(x * inv)). The e4m3 cast: Triton
lowers float32 -> e4m3 to one cvt.rn.satfinite (round to nearest even, as torch's conversion) on compute
capability 9.0+, but below that through fp16 truncated first (cvt.rz.f16.f32, then cvt.rn to e4m3): a
double rounding that rounds a value just above an e4m3 tie down to even, 0.29% of a bf16 activation's
values. There `to_e4m3` first rounds the float32 to odd at fp16's precision, which makes the
truncation exact and the second rounding the correct one (rounding to odd with at least two spare bits,
then to nearest, is rounding to nearest).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from railyard.engine.runner.layers.fp8 import FP8_MAX, INV_FP8_MAX, MIN_SCALE

# The widest row a per-token kernel holds in registers at once (wider rows go in blocks of this many columns).
MAX_ROW_BLOCK = 4096


def row_block_and_warps(width: int) -> tuple[int, int]:
    """The column block and warps of a per-token program over rows `width` wide (the quantization kernels')."""
    block = min(triton.next_power_of_2(width), MAX_ROW_BLOCK)
    return block, 4 if block <= 2048 else 8


@functools.cache
def casts_through_fp16(device: torch.device) -> bool:
    """Whether Triton's float32 -> e4m3 cast on `device` goes through a truncated fp16 (compute capability < 9.0)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0)


@triton.jit
def to_e4m3(v, ROUND_TO_ODD: tl.constexpr):
    """float32 already clamped to [-448, 448] -> float8e4nv, rounded to nearest even (ties to even) as torch rounds.

    ROUND_TO_ODD (where casts_through_fp16): keep fp16's 10 fraction bits of v, the lowest set if any bit below
    them is (round to odd), so the cast's truncation to fp16 drops nothing."""
    if ROUND_TO_ODD:
        bits = v.to(tl.int32, bitcast=True)
        sticky = ((bits & 0x1FFF) != 0).to(tl.int32)
        v = ((bits & -8192) | (sticky << 13)).to(tl.float32, bitcast=True)  # -8192: ~0x1FFF as an int32
    return v.to(tl.float8e4nv)


@triton.jit
def row_scale(amax, INV_FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    """A row's absolute maximum (float32) -> (scale, 1 / scale), the recipe's roundings."""
    scale = tl.maximum(amax * INV_FP8_MAX, MIN_SCALE)
    return scale, tl.math.div_rn(1.0, scale)


@triton.jit
def quantize_row(v, inv, ROUND_TO_ODD: tl.constexpr, FP8_MAX: tl.constexpr):
    """float32 values and the reciprocal of their row's scale -> e4m3, saturating."""
    return to_e4m3(tl.minimum(tl.maximum(v * inv, -FP8_MAX), FP8_MAX), ROUND_TO_ODD)


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, x_stride, N: tl.constexpr, BLOCK: tl.constexpr,
                            ONE_PASS: tl.constexpr, ROUND_TO_ODD: tl.constexpr, FP8_MAX: tl.constexpr,
                            INV_FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
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
    scale, inv = row_scale(amax, INV_FP8_MAX, MIN_SCALE)
    tl.store(s_ptr + row, scale)
    if ONE_PASS:
        tl.store(q_row + cols, quantize_row(x, inv, ROUND_TO_ODD, FP8_MAX), mask=mask)
    else:
        for start in range(0, N, BLOCK):
            c = start + cols
            x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
            tl.store(q_row + c, quantize_row(x, inv, ROUND_TO_ODD, FP8_MAX), mask=c < N)


def quantize_per_token_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit last stride) -> (q [M, K] float8_e4m3fn contiguous, scale [M, 1] float32)."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"quantize_per_token wants a 2-D input with unit last stride, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    block, warps = row_block_and_warps(k)
    _per_token_quant_kernel[(m,)](x, q, scale, x.stride(0), N=k, BLOCK=block, ONE_PASS=block >= k,
                                  ROUND_TO_ODD=casts_through_fp16(x.device), FP8_MAX=FP8_MAX,
                                  INV_FP8_MAX=INV_FP8_MAX, MIN_SCALE=MIN_SCALE, num_warps=warps)
    return q, scale


_SCALES_BLOCK = 1024


@triton.jit
def _apply_scales_kernel(acc_ptr, xs_ptr, ws_ptr, b_ptr, y_ptr, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.load(acc_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    y = acc * tl.load(xs_ptr + row) * tl.load(ws_ptr + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def apply_scales_triton(acc: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> torch.Tensor:
    """acc [M, N] (contiguous; float32, or bf16 / fp16) -> dtype((float32(acc) * x_scale[M, 1]) * weight_scale[N]
    (+ bias)), one pass.

    Bit for bit layers.fp8.apply_scales_ref: the same float32 multiplications in the same order, and no fused
    multiply-add (enable_fp_fusion=False) where the bias is added."""
    if acc.dim() != 2 or not acc.is_contiguous() or not acc.is_floating_point():
        raise ValueError(f"apply_scales wants a contiguous 2-D float input, got {acc.dtype} {tuple(acc.shape)} "
                         f"strides {acc.stride()}")
    m, n = acc.shape
    y = torch.empty((m, n), dtype=dtype, device=acc.device)
    if m == 0 or n == 0:
        return y
    xs = x_scale.reshape(-1).contiguous()
    ws = weight_scale.reshape(-1).contiguous()
    b = bias.contiguous() if bias is not None else ws  # not read without HAS_BIAS
    _apply_scales_kernel[(m, triton.cdiv(n, _SCALES_BLOCK))](acc, xs, ws, b, y, n, HAS_BIAS=bias is not None,
                                                              BLOCK=_SCALES_BLOCK, num_warps=4,
                                                              enable_fp_fusion=False)
    return y
