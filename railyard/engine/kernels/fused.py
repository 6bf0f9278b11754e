"""Fused elementwise kernels for the GPU path: residual-add + RMSNorm, SiLU-and-mul, rotary.

Unfused, each of these is 5-10 passes over the activations (casts, pow, mean, rsqrt, cat...);
the profile of a 7B prefill step showed them at a quarter of the step. Each kernel makes one
pass and rounds to the activation dtype exactly where the torch code (and HF transformers) does,
so results match the unfused layers (up to the order of the RMS reduction).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_stride_t, x_stride_h, res_stride,
                     out_stride, heads, eps, N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    row = tl.program_id(0)
    t = row // heads
    h = row % heads
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + t.to(tl.int64) * x_stride_t + h * x_stride_h + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RES:
        r = tl.load(res_ptr + row.to(tl.int64) * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the residual stream is kept in the model dtype
        tl.store(res_out_ptr + row.to(tl.int64) * res_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / N
    y = (xf * tl.rsqrt(var + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, out, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim of x [T, D] or [T, H, D] (rows may be strided views, e.g. q of a fused QKV).

    With residual: returns (norm(x + residual), x + residual), like RMSNorm.forward.
    """
    d = x.shape[-1]
    if x.dim() == 2:
        t, heads, s_t, s_h = x.shape[0], 1, x.stride(0), 0
    else:
        t, heads, s_t, s_h = x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    assert x.stride(-1) == 1 and weight.dtype == x.dtype
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = t * heads
    if rows == 0:
        return out if residual is None else (out, residual)
    block = triton.next_power_of_2(d)
    warps = 1 if block <= 256 else (4 if block <= 4096 else 8)
    if residual is None:
        _rms_norm_kernel[(rows,)](x, x, weight, out, out, s_t, s_h, 0, d, heads, eps, N=d, BLOCK=block,
                                  HAS_RES=False, num_warps=warps)
        return out
    assert residual.is_contiguous() and x.dim() == 2
    new_res = torch.empty_like(residual)
    _rms_norm_kernel[(rows,)](x, residual, weight, out, new_res, s_t, s_h, residual.stride(0), d, heads, eps,
                              N=d, BLOCK=block, HAS_RES=True, num_warps=warps)
    return out, new_res


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    base = x_ptr + row.to(tl.int64) * x_stride
    g = tl.load(base + cols, mask=mask, other=0.0)
    u = tl.load(base + N + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    out = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, out, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
    t, two_i = x.shape
    n = two_i // 2
    assert x.stride(-1) == 1
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block = 1024
    _silu_and_mul_kernel[(t, triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), N=n, BLOCK=block,
                                                     num_warps=4)
    return out


@triton.jit
def _rotary_kernel(x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, x_stride_t, x_stride_h, heads,
                   HALF: tl.constexpr, H_PAD: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    h = tl.arange(0, H_PAD)
    c = tl.arange(0, BLOCK)
    hmask = h < heads
    cmask = c < HALF
    mask = hmask[:, None] & cmask[None, :]
    base = x_ptr + t.to(tl.int64) * x_stride_t + h[:, None] * x_stride_h + c[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    # cos/sin tables are float32 [max_pos, 2*HALF] (both halves equal); cast like the torch path does
    cos = tl.load(cos_ptr + pos * (2 * HALF) + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * (2 * HALF) + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    # x*cos + rotate_half(x)*sin, each product rounded to the model dtype as in the unfused code
    o1 = ((f1 * cos).to(dtype).to(tl.float32) + (-f2 * sin).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((f2 * cos).to(dtype).to(tl.float32) + (f1 * sin).to(dtype).to(tl.float32)).to(dtype)
    out = out_ptr + t.to(tl.int64) * (heads * 2 * HALF) + h[:, None] * (2 * HALF) + c[None, :]
    tl.store(out, o1, mask=mask)
    tl.store(out + HALF, o2, mask=mask)


def rotary(positions: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary of x [T, H, D] (any row/head strides) -> a new contiguous [T, H, D]."""
    t, heads, d = x.shape
    assert x.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    half = d // 2
    _rotary_kernel[(t,)](x, out, positions, cos, sin, x.stride(0), x.stride(1), heads,
                         HALF=half, H_PAD=triton.next_power_of_2(heads), BLOCK=triton.next_power_of_2(half),
                         num_warps=4 if heads * half >= 1024 else 1)
    return out
