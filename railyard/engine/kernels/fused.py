"""Fused elementwise kernels for the GPU path: residual-add + RMSNorm and SiLU-and-mul.

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
