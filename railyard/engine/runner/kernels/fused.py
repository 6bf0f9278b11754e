"""Fused elementwise kernels for the GPU path: residual-add + RMSNorm, SiLU-and-mul and rotary.

Unfused, each of these is 5-10 passes over the activations (casts, pow, mean, rsqrt, cat...);
the profile of a 7B prefill step showed them at a quarter of the step. Each kernel makes one
pass and rounds to the activation dtype exactly where the torch code (and HF transformers) does,
so results match the unfused layers (up to the order of the RMS reduction).

Before an FP8 linear layer (RMSNorm before qkv and gate_up, SiLU-and-mul before down) the norm and the
activation can also quantize their output per token (rms_norm_quant, silu_and_mul_quant): e4m3 and one float32
scale per row, the same bytes kernels/fp8.quantize_per_token_triton makes of the unfused output (the same float32
operations on the same values: the output is rounded to the model dtype first, as the unfused kernel stores
it), without writing and re-reading that output and without a separate launch per linear layer.

After an FP8 o or down projection through cuBLASLt (layers/fp8.py's ScaledAccumulator) the residual-add RMSNorm
also takes the GEMM's unscaled float32 sums and applies the per-token and per-channel scales itself (`scales`):
the same float32 products apply_scales makes, rounded to the model dtype, so the bytes are those of apply_scales
then the norm, without that launch and its bf16 intermediate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from railyard.engine.runner.kernels.fp8 import (
    MAX_ROW_BLOCK,
    casts_through_fp16,
    quantize_row,
    row_block_and_warps,
    row_scale,
)
from railyard.engine.runner.layers.fp8 import FP8_MAX, INV_FP8_MAX, MIN_SCALE

# rms_norm_quant holds a row in registers (as the per-token kernel's one-pass case): wider rows go through rms_norm
# and the linear layer's own quantization.
QUANT_MAX_WIDTH = MAX_ROW_BLOCK
# The model dtypes the norm takes unscaled GEMM sums for (`scales`): in float32 the residual add could contract
# with the scales' product into one FMA (fp fusion stays on, as for the unfused norm, so that the rest of the
# kernel compiles alike), where apply_scales rounds the product first; a 16-bit model's cast in between rules
# that out. (FP8 weights take the tensor-core path in bf16 models only.)
SCALED_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, s_ptr, xs_ptr, ws_ptr, x_stride_t, x_stride_h,
                     res_stride, out_stride, heads, eps, N: tl.constexpr, BLOCK: tl.constexpr,
                     HAS_RES: tl.constexpr, QUANT: tl.constexpr = False, SCALED: tl.constexpr = False,
                     ROUND_TO_ODD: tl.constexpr = False, FP8_MAX: tl.constexpr = 448.0,
                     INV_FP8_MAX: tl.constexpr = 1.0, MIN_SCALE: tl.constexpr = 1.0):
    """QUANT: out_ptr is e4m3 and s_ptr the rows' float32 scales; the output is quantized per row instead of
    stored in the model dtype. SCALED: x_ptr holds an unscaled GEMM's float32 sums and xs_ptr, ws_ptr its
    per-token and per-channel scales; x is what apply_scales would store (its float32 products in its order,
    rounded to the model dtype, w's)."""
    row = tl.program_id(0)
    t = row // heads
    h = row % heads
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + t.to(tl.int64) * x_stride_t + h * x_stride_h + cols, mask=mask, other=0.0)
    if SCALED:
        dtype = w_ptr.dtype.element_ty
        x = (x.to(tl.float32) * tl.load(xs_ptr + t) * tl.load(ws_ptr + cols, mask=mask, other=0.0)).to(dtype)
    else:
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
    if QUANT:
        of = out.to(tl.float32)  # masked columns are 0 (x and w load as 0): they do not move the maximum
        scale, inv = row_scale(tl.max(tl.abs(of), 0), INV_FP8_MAX, MIN_SCALE)
        tl.store(s_ptr + row, scale)
        tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, quantize_row(of, inv, ROUND_TO_ODD, FP8_MAX),
                 mask=mask)
    else:
        tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, out, mask=mask)


def _rms_norm_warps(block: int) -> int:
    """Warps per row; the same for rms_norm_quant as for rms_norm, since the sum of squares' order follows them."""
    return 1 if block <= 256 else (4 if block <= 4096 else 8)


Scales = tuple[torch.Tensor, torch.Tensor]


def _scale_args(x: torch.Tensor, weight: torch.Tensor, scales: Scales | None,
                spare: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The kernel's (xs_ptr, ws_ptr, SCALED) for `scales` (x_scale [T, 1], weight_scale [D] float32: x [T, D] is
    an unscaled GEMM's float32 sums, weight in the model dtype), or (spare, spare, False), not read, for none."""
    if scales is None:
        assert weight.dtype == x.dtype
        return spare, spare, False
    x_scale, weight_scale = scales
    assert x.dim() == 2 and x.dtype == torch.float32 and weight.dtype in SCALED_DTYPES
    assert x_scale.numel() == x.shape[0] and weight_scale.numel() == x.shape[1]
    return x_scale.reshape(-1).contiguous(), weight_scale.reshape(-1).contiguous(), True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, scales: Scales | None = None):
    """RMSNorm over the last dim of x [T, D] or [T, H, D] (rows may be strided views, e.g. q of a fused QKV).

    With residual: returns (norm(x + residual), x + residual), like RMSNorm.forward. With scales: x [T, D] is an
    unscaled GEMM's float32 sums, and the norm is that of layers.fp8.apply_scales(x, *scales, None, weight.dtype).
    """
    d = x.shape[-1]
    if x.dim() == 2:
        t, heads, s_t, s_h = x.shape[0], 1, x.stride(0), 0
    else:
        t, heads, s_t, s_h = x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    assert x.stride(-1) == 1
    xs, ws, scaled = _scale_args(x, weight, scales, weight)
    out = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    rows = t * heads
    if rows == 0:
        return out if residual is None else (out, residual)
    block = triton.next_power_of_2(d)
    warps = _rms_norm_warps(block)
    if residual is None:
        _rms_norm_kernel[(rows,)](x, x, weight, out, out, out, xs, ws, s_t, s_h, 0, d, heads, eps, N=d,
                                  BLOCK=block, HAS_RES=False, SCALED=scaled, num_warps=warps)
        return out
    assert residual.is_contiguous() and x.dim() == 2
    new_res = torch.empty_like(residual)
    _rms_norm_kernel[(rows,)](x, residual, weight, out, new_res, out, xs, ws, s_t, s_h, residual.stride(0), d,
                              heads, eps, N=d, BLOCK=block, HAS_RES=True, SCALED=scaled, num_warps=warps)
    return out, new_res


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                   scales: Scales | None = None):
    """rms_norm of x [T, D] quantized per token in the same pass: ((q [T, D] e4m3, scale [T, 1] float32), and
    x + residual when residual is given). Bit for bit quantize_per_token(rms_norm(x, ...)); D up to
    QUANT_MAX_WIDTH. scales: as rms_norm's."""
    t, d = x.shape
    assert x.stride(-1) == 1 and d <= QUANT_MAX_WIDTH
    assert residual is None or residual.is_contiguous()
    xs, ws, scaled = _scale_args(x, weight, scales, weight)
    q = torch.empty((t, d), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    new_res = None if residual is None else torch.empty_like(residual)
    if t > 0:
        block = triton.next_power_of_2(d)
        res = x if residual is None else residual
        _rms_norm_kernel[(t,)](x, res, weight, q, x if new_res is None else new_res, scale, xs, ws, x.stride(0), 0,
                               res.stride(0), d, 1, eps, N=d, BLOCK=block, HAS_RES=residual is not None,
                               QUANT=True, SCALED=scaled, ROUND_TO_ODD=casts_through_fp16(x.device), FP8_MAX=FP8_MAX,
                               INV_FP8_MAX=INV_FP8_MAX, MIN_SCALE=MIN_SCALE, num_warps=_rms_norm_warps(block))
    return (q, scale) if residual is None else ((q, scale), new_res)


@triton.jit
def silu_mul_values(g, u):
    """silu(g) * u, rounded to their dtype as torch rounds it (the SiLU, then the product), as float32."""
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    return (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)


@triton.jit
def _silu_mul_block(base, cols, N: tl.constexpr):
    """silu(gate) * up of columns `cols` of one row, rounded to the model dtype as torch rounds it, as float32
    (0 in masked columns)."""
    mask = cols < N
    g = tl.load(base + cols, mask=mask, other=0.0)
    u = tl.load(base + N + cols, mask=mask, other=0.0)
    return silu_mul_values(g, u)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    out = _silu_mul_block(x_ptr + row.to(tl.int64) * x_stride, cols, N)  # exact in float32: storing is a no-op cast
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def clamped_swiglu_values(gate, up, alpha, limit, dtype: tl.constexpr):
    """gpt-oss's activation of gate and up (values of the model dtype `dtype`, in any float type), each torch op
    of layers/activation.py's native form rounded to `dtype` in turn (the clamps are exact; NaN passes through them
    as torch.clamp passes it), as float32."""
    g = gate.to(tl.float32)
    g = tl.where(g > limit, limit, g)
    u = up.to(tl.float32)
    u = tl.where(u > limit, limit, tl.where(u < -limit, -limit, u))
    a = (u + 1.0).to(dtype).to(tl.float32)
    b = (g * alpha).to(dtype).to(tl.float32)
    sig = (1.0 / (1.0 + tl.exp(-b))).to(dtype).to(tl.float32)
    c = (g * sig).to(dtype).to(tl.float32)
    return (a * c).to(dtype).to(tl.float32)


@triton.jit
def _clamped_swiglu_kernel(x_ptr, out_ptr, x_stride, out_stride, alpha, limit, N: tl.constexpr,
                           BLOCK: tl.constexpr):
    """gpt-oss's activation of one row's columns (clamped_swiglu_values)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + N + cols, mask=mask, other=0.0)
    out = clamped_swiglu_values(gate, up, alpha, limit, gate.dtype)
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_quant_kernel(x_ptr, q_ptr, s_ptr, x_stride, N: tl.constexpr, BLOCK: tl.constexpr,
                               ONE_PASS: tl.constexpr, ROUND_TO_ODD: tl.constexpr, FP8_MAX: tl.constexpr,
                               INV_FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    """One program per row. ONE_PASS: the row's SiLU-and-mul outputs stay in registers between its maximum and
    their quantization, so gate and up are read once. Otherwise (rows wider than SILU_QUANT_ONE_PASS_MAX) the
    maximum is taken over blocks, then each block is recomputed from gate and up and quantized: two reads."""
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * x_stride
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        v = _silu_mul_block(base, cols, N)
        scale, inv = row_scale(tl.max(tl.abs(v), 0), INV_FP8_MAX, MIN_SCALE)
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * N + cols, quantize_row(v, inv, ROUND_TO_ODD, FP8_MAX), mask=cols < N)
    else:
        run = tl.zeros([BLOCK], tl.float32)
        for start in range(0, N, BLOCK):
            run = tl.maximum(run, tl.abs(_silu_mul_block(base, start + cols, N)))
        scale, inv = row_scale(tl.max(run, 0), INV_FP8_MAX, MIN_SCALE)
        tl.store(s_ptr + row, scale)
        for start in range(0, N, BLOCK):
            c = start + cols
            v = _silu_mul_block(base, c, N)
            tl.store(q_ptr + row * N + c, quantize_row(v, inv, ROUND_TO_ODD, FP8_MAX), mask=c < N)


# The widest SiLU-and-mul row quantized in one pass (the 7B's 18,944 and a 70B's 28,672 fit): the row's outputs in
# registers, 64 float32 per thread at 16 warps. Wider rows take two passes, reading each row twice.
SILU_QUANT_ONE_PASS_MAX = 32768


def silu_quant_block_and_warps(n: int) -> tuple[int, int, bool]:
    """(column block, warps, one pass) of silu_and_mul_quant's program over a row of n outputs."""
    block = triton.next_power_of_2(n)
    if block > SILU_QUANT_ONE_PASS_MAX:
        block, warps = row_block_and_warps(n)  # the per-token kernel's blocks and warps
        return block, warps, False
    return block, max(4, min(16, block // 2048)), True


def silu_and_mul_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, 2I] (gate | up) -> (q [T, I] e4m3, scale [T, 1] float32): bit for bit
    quantize_per_token(silu_and_mul(x))."""
    t, two_i = x.shape
    n = two_i // 2
    assert x.stride(-1) == 1
    q = torch.empty((t, n), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if t > 0:
        block, warps, one_pass = silu_quant_block_and_warps(n)
        _silu_and_mul_quant_kernel[(t,)](x, q, scale, x.stride(0), N=n, BLOCK=block, ONE_PASS=one_pass,
                                         ROUND_TO_ODD=casts_through_fp16(x.device), FP8_MAX=FP8_MAX,
                                         INV_FP8_MAX=INV_FP8_MAX, MIN_SCALE=MIN_SCALE, num_warps=warps)
    return q, scale


def _gated_rows(x: torch.Tensor, kernel, *args, **options) -> torch.Tensor:
    """x [T, 2I] (gate | up) -> [T, I] in x's dtype through a gated activation's kernel (x, out, their row strides,
    then args), one program per row and 1,024 columns."""
    t, two_i = x.shape
    n = two_i // 2
    assert x.stride(-1) == 1
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block = 1024
    kernel[(t, triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), *args, N=n, BLOCK=block, num_warps=4,
                                       **options)
    return out


def clamped_swiglu(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """x [T, 2I] (gate | up) -> gpt-oss's clamped SwiGLU [T, I] in one pass (one read of x, one write), rounded as
    layers.activation.clamped_swiglu_native's seven torch ops round it."""
    # no FMA contraction: torch rounds every product before the next op
    return _gated_rows(x, _clamped_swiglu_kernel, alpha, limit, enable_fp_fusion=False)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
    return _gated_rows(x, _silu_and_mul_kernel)


@triton.jit
def _rotary_heads(x_ptr, out_ptr, t, pos, cos_ptr, sin_ptr, x_stride_t, x_stride_h, h0, heads,
                  HALF: tl.constexpr, BLOCK: tl.constexpr, HB: tl.constexpr):
    """Heads [h0, h0 + HB) of token t: out = x * cos + rotate_half(x) * sin, rounded as torch rounds it."""
    h = h0 + tl.arange(0, HB)
    c = tl.arange(0, BLOCK)
    cmask = c < HALF
    mask = (h < heads)[:, None] & cmask[None, :]
    src = x_ptr + t.to(tl.int64) * x_stride_t + h[:, None] * x_stride_h + c[None, :]
    x1 = tl.load(src, mask=mask, other=0.0)
    x2 = tl.load(src + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    # The tables are float32 [max_pos, 2*HALF]; torch indexes them and casts to the activation dtype.
    row = pos * (2 * HALF)
    c1 = tl.load(cos_ptr + row + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + row + HALF + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + row + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + row + HALF + c, mask=cmask, other=0.0).to(dtype).to(tl.float32)[None, :]
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    # torch: a = x*cos and b = rotate_half(x)*sin, each rounded to dtype, then (a + b) rounded to dtype.
    # A product of two 16-bit floats is exact in float32 and the float32 sum of two of them rounds
    # innocuously, so float32 math + one cast per torch op is bit-exact. LLVM narrows such cast pairs
    # to native f16/bf16 mul and add, and with FP fusion on (Triton's default) contracts those into
    # fma.rn.f16 across torch's rounding of the product (the earlier fused rotary's GPU mismatch);
    # for float32 the casts vanish and a*b + c becomes fma.rn.f32. Hence enable_fp_fusion=False at launch.
    a1 = (f1 * c1).to(dtype).to(tl.float32)
    a2 = (f2 * c2).to(dtype).to(tl.float32)
    b2 = (f1 * s2).to(dtype).to(tl.float32)
    # rotate_half's first half is -x2: a1 + (-x2)*s1 == a1 - x2*s1 in IEEE arithmetic, signed zeros
    # included, whereas Triton's unary minus is 0 - x (+0 for x = +0, where torch's -x is -0).
    nb1 = (f2 * s1).to(dtype).to(tl.float32)
    dst = out_ptr + t.to(tl.int64) * (heads * 2 * HALF) + h[:, None] * (2 * HALF) + c[None, :]
    tl.store(dst, (a1 - nb1).to(dtype), mask=mask)
    tl.store(dst + HALF, (a2 + b2).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, pos_ptr, cos_ptr, sin_ptr,
                   q_stride_t, q_stride_h, k_stride_t, k_stride_h, q_heads, k_heads, q_blocks,
                   HALF: tl.constexpr, BLOCK: tl.constexpr, HB_Q: tl.constexpr, HB_K: tl.constexpr):
    t = tl.program_id(0)
    blk = tl.program_id(1)  # [0, q_blocks) are q's head blocks, the rest k's
    pos = tl.load(pos_ptr + t).to(tl.int64)
    if blk < q_blocks:
        _rotary_heads(q_ptr, q_out_ptr, t, pos, cos_ptr, sin_ptr, q_stride_t, q_stride_h, blk * HB_Q, q_heads,
                      HALF, BLOCK, HB_Q)
    else:
        _rotary_heads(k_ptr, k_out_ptr, t, pos, cos_ptr, sin_ptr, k_stride_t, k_stride_h, (blk - q_blocks) * HB_K,
                      k_heads, HALF, BLOCK, HB_K)


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Neox-style rotary of q [T, Hq, D] and k [T, Hk, D] in one launch -> new contiguous (q_out, k_out).

    q and k may be strided views (e.g. of the fused QKV output; unit last stride). cos/sin are the
    float32 [max_pos, D] tables of RotaryEmbedding. Bit-exact with RotaryEmbedding.forward_native.
    """
    t, q_heads, d = q.shape
    k_heads = k.shape[1]
    assert k.shape == (t, k_heads, d) and positions.shape == (t,) and d % 2 == 0
    assert q.dtype == k.dtype and q.stride(-1) == 1 and k.stride(-1) == 1
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape[-1] == d and sin.shape == cos.shape
    assert cos.is_contiguous() and sin.is_contiguous()
    q_out = torch.empty((t, q_heads, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, k_heads, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    half = d // 2
    block = triton.next_power_of_2(half)
    cap = max(1, 1024 // block)  # about 1024 (x1, x2) pairs per program
    hb_q = min(triton.next_power_of_2(q_heads), cap)
    hb_k = min(triton.next_power_of_2(k_heads), cap)
    q_blocks = triton.cdiv(q_heads, hb_q)
    grid = (t, q_blocks + triton.cdiv(k_heads, hb_k))
    _rotary_kernel[grid](q, k, q_out, k_out, positions.contiguous(), cos, sin,
                         q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_heads, k_heads, q_blocks,
                         HALF=half, BLOCK=block, HB_Q=hb_q, HB_K=hb_k, num_warps=4,
                         enable_fp_fusion=False)  # no FMA: torch rounds the products before the add
    return q_out, k_out
