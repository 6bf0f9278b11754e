"""A Triton FP8 GEMM with the per-token and per-channel scales (and the bias) applied in its epilogue: the
`fp8_gemm="triton"` engine option, a candidate for decode-size batches where torch's row-wise _scaled_mm has
too few tiles to fill the GPU (layers/fp8.py).

y[m, n] = dtype((sum_k xq[m, k] wq[n, k]) * x_scale[m] * w_scale[n] (+ bias[n])), float32 accumulation. On
sm_90 Triton's FP8 dot accumulates in the tensor cores' reduced precision unless told otherwise
(max_num_imprecise_acc, 2^30 by default there): PRECISE adds each BLOCK_K-deep partial product into the float32
accumulator, as CUTLASS and cuBLAS do without fast accumulation. Tiles: small BLOCK_M for small batches, and
triton.autotune over a few configurations per power-of-two bucket of M (timed at the first call of each
bucket, i.e. in the engine's eager warm-up runs, never under CUDA graph capture: graph_capture.capture_each).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from railyard.engine.runner.graph_capture import NeedsWarmUp, capturing

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): small-M tiles that cut a 3584..37888-wide output into
# enough programs for 132 SMs, and the usual large ones.
CONFIGS = [(16, 64, 128, 4, 5), (32, 64, 128, 4, 5), (64, 64, 128, 4, 4), (64, 128, 128, 4, 4),
           (128, 128, 128, 8, 3), (128, 256, 64, 8, 3)]


def _config(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)


@triton.jit(do_not_specialize=["M", "M_BUCKET"])  # one compiled kernel per tile for every batch size
def _fp8_gemm_kernel(a_ptr, b_ptr, y_ptr, as_ptr, bs_ptr, bias_ptr, M, N, K, stride_am, stride_bn, stride_ym,
                     M_BUCKET, HAS_BIAS: tl.constexpr, PRECISE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n  # programs of GROUP_M row blocks sweep N together: their W tiles stay in L2
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * stride_bn + rk[:, None]  # W [N, K] read as its transpose [K, N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rn[None, :] < N) & (rk[:, None] < k_left), other=0.0)
        if PRECISE:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    xs = tl.load(as_ptr + rm, mask=rm < M, other=0.0)
    ws = tl.load(bs_ptr + rn, mask=rn < N, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing, shortened (5 ms warm-up, 20 ms of runs instead of 25 and 100): it runs for every
    (M bucket, N, K) an engine meets, in its warm-up. Under CUDA graph capture it cannot (timing synchronises the
    device): NeedsWarmUp asks the capture for an eager run of that size first (graph_capture.capture_each)."""
    if capturing():
        raise NeedsWarmUp("the FP8 GEMM's autotuner would time its configurations under CUDA graph capture")
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


_autotuned = triton.autotune(configs=[_config(*c) for c in CONFIGS], key=["M_BUCKET", "N", "K"],
                             do_bench=_quick_bench)(_fp8_gemm_kernel)


def fp8_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             bias: torch.Tensor | None, dtype: torch.dtype, precise: bool = True,
             config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """xq [M, K] e4m3 (unit last stride), x_scale [M, 1], weight [N, K] e4m3 (row-major), weight_scale [N] ->
    [M, N] in dtype. config: one of CONFIGS' tuples (the sweep times each); None: autotuned per M bucket."""
    if xq.dim() != 2 or xq.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"fp8_gemm wants row-major 2-D operands, got {tuple(xq.shape)} strides {xq.stride()} "
                         f"and {tuple(weight.shape)} strides {weight.stride()}")
    m, k = xq.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=dtype, device=xq.device)
    if m == 0:
        return y
    xs, ws = x_scale.reshape(-1).contiguous(), weight_scale.reshape(-1).contiguous()
    b = bias.contiguous() if bias is not None else ws  # not read without HAS_BIAS
    args = (xq, weight, y, xs, ws, b, m, n, k, xq.stride(0), weight.stride(0), y.stride(0),
            triton.next_power_of_2(m))
    if config is None:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _autotuned[grid](*args, HAS_BIAS=bias is not None, PRECISE=precise, GROUP_M=8)
    else:
        bm, bn, bk, warps, stages = config
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _fp8_gemm_kernel[grid](*args, HAS_BIAS=bias is not None, PRECISE=precise, BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    return y
