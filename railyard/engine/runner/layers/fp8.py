"""FP8 (e4m3) quantization: weights per output channel, activations per token, the KV cache per layer.

Numbers are symmetric: q = round(x / scale) in float8_e4m3fn, scale = amax / 448 over the row a scale
covers, so the largest element lands on e4m3's largest finite value and nothing saturates. GEMMs go
through torch._scaled_mm where the GPU has FP8 tensor cores (compute capability 8.9+, bf16 output);
elsewhere the same quantized numbers are dequantized and multiplied (the reference path), so results
differ only by accumulation order.

Which _scaled_mm (the `fp8_gemm` engine option). With row-wise scales (per token x per channel) torch runs its
own CUTLASS kernel where its cuBLAS is older than 12.9, and from 12.9 on sm_90 cuBLASLt's outer-vector scaling
(aten ScaledBlas.cpp, _scaled_rowwise_rowwise); the kernel names a GPU run reports are in docs/lab-notes.
"rowwise" is that call; "rowwise-fast" the same with use_fast_accum=True: Hopper's FP8 MMA accumulates at reduced
precision (about 14 significant bits; DeepSeek-V3 report, 3.3.2), and without fast accumulation the kernel
promotes its partial sums to float32 every few K blocks; with it, it does not (vLLM's CUTLASS sm90 FP8 kernels use
the fast-accumulation schedules). Its error bound is the GPU test's (tests/engine/runner/layers/test_fp8.py).
"cublaslt" keeps the per-token and per-channel numbers: an unscaled GEMM (unit scalar scales, float32 out), then
one pass that multiplies by both scales, adds the bias and casts (vLLM's torch_channelwise_w8a8_scaled_mm does
the same in torch ops). Taken everywhere it loses to "rowwise" end to end, so "auto" takes it ("cublaslt-fast")
only where the row-wise kernel, which never splits K, underfills the GPU (tensor_core_gemm).

The per-token quantization of an activation can come fused into the kernel that makes it (kernels/fused.py:
RMSNorm before qkv and gate_up, SiLU-and-mul before down): those pass fp8_linear a QuantizedActivation, the
same bytes quantize_per_token would make, and fp8_linear skips its own pass.

At the other end, the scales pass after a cuBLASLt GEMM can go into the kernel that reads the result next: the
o and down projections (one rank, no bias) hand their RMSNorm a ScaledAccumulator, and the fused residual-add
RMSNorm applies the scales as apply_scales would, bit for bit, instead of a separate launch writing a bf16 copy
that the norm then reads back.

One recipe, in IEEE float32 operations only, so that torch on the CPU, torch on CUDA and the Triton kernels
(kernels/fp8.py, kernels/paged_attention.py) produce the same bytes: scale = max(amax * INV_FP8_MAX,
MIN_SCALE), inv = 1 / scale (a rounded division), q = e4m3(clamp(x * inv, +-448)), rounded to nearest even.
Written as `amax / 448` it would not be one recipe: torch on CUDA turns a division by a Python number into
a multiplication by its float32 reciprocal, which differs from the CPU's (and Triton's) rounded division in
about half of all quotients, and a bf16 activation whose quotient sits on an e4m3 rounding tie then lands one
e4m3 step apart (scripts/dev/fp8_gemm_replay.py replays such a mismatch on the CPU).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F

from railyard.engine.runner.graph_capture import NeedsWarmUp, capturing
from railyard.engine.runner.kernels import fp8_ops
from railyard.errors import ConfigError
from railyard.model.precision import Fp8Gemm

log = logging.getLogger("railyard.engine")

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def as_float32(value: float) -> float:
    """A Python float rounded to float32 (still a Python float: exact wherever float32 math meets it)."""
    return torch.tensor(value, dtype=torch.float32).item()


INV_FP8_MAX = as_float32(1 / FP8_MAX)
# Smallest scale: an all-zero row (a padded batch row) must not divide by zero.
MIN_SCALE = as_float32(1e-12)


@functools.cache  # a handful of per-layer KV scales, asked for every layer of every step
def reciprocal(scale: float) -> float:
    """1 / scale as float32 rounds it (one rounded float32 division, as torch.reciprocal and Triton's div_rn)."""
    return torch.tensor(scale, dtype=torch.float32).reciprocal().item()


def scales_of(amax: torch.Tensor) -> torch.Tensor:
    """float32 absolute maxima -> their scales (amax / 448, as a float32 multiplication every path rounds alike)."""
    return (amax * INV_FP8_MAX).clamp(min=MIN_SCALE)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] fp8, scale [N] float32): one scale per row (per output channel of a weight)."""
    wf = w.float()
    scale = scales_of(wf.abs().amax(dim=-1))
    return to_fp8(wf * scale.reciprocal()[:, None]), scale


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """float32 already divided by its scale -> e4m3, saturating (the cast alone may give NaN out of range), rounded
    to nearest even."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] fp8, scale [M, 1] float32); plain torch, the oracle of the Triton kernel."""
    xf = x.float()
    scale = scales_of(xf.abs().amax(dim=-1, keepdim=True))
    return to_fp8(xf * scale.reciprocal()), scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token activation quantization: one Triton pass on CUDA (when triton imports), else torch."""
    ops = fp8_ops() if x.is_cuda else None
    if ops is not None:
        return ops.quantize_per_token_triton(x)
    return quantize_per_token_ref(x)


@functools.lru_cache(maxsize=None)
def _has_fp8_tensor_cores(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def scaled_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """torch._scaled_mm with row-wise scales runs on FP8 tensor cores (sm_89+) and writes bf16 only."""
    return device.type == "cuda" and dtype == torch.bfloat16 and _has_fp8_tensor_cores(device.index or 0)


# The tensor-core GEMMs fp8_linear can take (the engine's fp8_gemm option): "rowwise" torch's row-wise scaled
# _scaled_mm, "rowwise-fast" the same with fast accumulation, "cublaslt" an unscaled cuBLASLt GEMM then the
# scales, "cublaslt-fast" the same with fast accumulation, "auto" cuBLASLt or row-wise by the GEMM's shape
# (tensor_core_gemm), "triton" a Triton GEMM with the scales in its epilogue (kernels/fp8_gemm.py; a candidate,
# not in auto).
FP8_GEMMS: tuple[str, ...] = get_args(Fp8Gemm)  # the engine option's choices, one list
# "auto" takes cuBLASLt (unscaled GEMM + scales pass) for GEMMs of at most this many rows whose row-wise grid
# would not fill the GPU once (rowwise_underfills), and the row-wise kernel (AUTO_ROWWISE) for the rest.
# The row-wise kernel (cuBLASLt's outer-vector-scaled nvjet on sm_90) tiles the output 128 x 128 and never splits
# K, so a decode-sized o or down projection (N 3584, K 18944 on a 7B) is a few dozen tiles each walking all of K;
# the unscaled GEMM, which cuBLASLt may split along K, plus the scales pass is faster there. Taken everywhere it
# lost end to end (gate_up and the prefill sizes), hence the threshold.
CUBLASLT_MAX_TOKENS = 256
ROWWISE_TILE = 128  # the row-wise kernel's output tile, both sides (the sweep's kernel names)
# The row-wise GEMM "auto" takes for the rest: fast accumulation (as vLLM's CUTLASS FP8 kernels on sm_90): faster
# end to end at no measurable cost in accuracy against bf16 (docs/architecture.md); auto's cuBLASLt GEMMs accumulate
# the same way (AUTO_CUBLASLT).
AUTO_ROWWISE = "rowwise-fast"
AUTO_CUBLASLT = "cublaslt-fast"


def check_fp8_gemm(fp8_gemm: str) -> str:
    """An fp8_gemm option value, or ConfigError naming the choices."""
    if fp8_gemm not in FP8_GEMMS:
        raise ConfigError(f"fp8_gemm must be one of {', '.join(FP8_GEMMS)}; got {fp8_gemm!r}")
    return fp8_gemm


def rowwise_underfills(rows: int, n: int, sms: int) -> bool:
    """Whether the row-wise kernel's [rows, n] output has fewer ROWWISE_TILE-square tiles than the GPU has SMs."""
    return -(-rows // ROWWISE_TILE) * -(-n // ROWWISE_TILE) < sms


def tensor_core_gemm(fp8_gemm: str, rows: int, n: int = 0, sms: int = 0) -> str:
    """The tensor-core GEMM (any FP8_GEMMS choice but "auto") an fp8_gemm option picks for a [rows, n] output on a
    GPU of `sms` SMs (0: unknown, and then auto takes the row-wise kernel)."""
    if fp8_gemm == "auto":
        small = rows <= CUBLASLT_MAX_TOKENS and rowwise_underfills(rows, n, sms)
        return AUTO_CUBLASLT if small else AUTO_ROWWISE
    return check_fp8_gemm(fp8_gemm)


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def gemm_path(device: torch.device, dtype: torch.dtype, fp8_gemm: str = "auto") -> str:
    """Which FP8 GEMM a model on `device` in `dtype` runs, in words (the start-up report says it)."""
    if scaled_mm_supported(device, dtype):
        which = {"rowwise": "row-wise scales", "rowwise-fast": "row-wise scales, fast accumulation",
                 "cublaslt": "cuBLASLt, scales applied after",
                 "cublaslt-fast": "cuBLASLt with fast accumulation, scales applied after",
                 "triton": "a Triton GEMM, scales in its epilogue"}
        which["auto"] = (f"{which[AUTO_CUBLASLT]} up to {CUBLASLT_MAX_TOKENS} tokens where the row-wise kernel "
                         f"would not fill the GPU, {which[AUTO_ROWWISE]} elsewhere")
        return f"torch._scaled_mm (FP8 tensor cores; {which[check_fp8_gemm(fp8_gemm)]})"
    why = "no FP8 tensor cores" if device.type != "cuda" or not _has_fp8_tensor_cores(device.index or 0) \
        else f"a {str(dtype).removeprefix('torch.')} model: the tensor-core path is for bfloat16 models"
    return f"reference: dequantize then matmul ({why})"


@dataclass(frozen=True)
class QuantizedActivation:
    """An activation already quantized per token by the kernel that made it: q [M, K] e4m3 (row-major), scale
    [M, 1] float32 (quantize_per_token's outputs, bit for bit), dtype the model dtype it stands for."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


@dataclass(frozen=True)
class ScaledAccumulator:
    """A GEMM result whose per-token and per-channel scales are still to be applied: acc [M, N] float32 (the
    unscaled cuBLASLt GEMM's sums), x_scale [M, 1] and weight_scale [N] float32, dtype the model dtype.
    fp8_linear(defer_scales=True) hands one out so that the fused RMSNorm reading the result next applies the
    scales in its own pass (no apply_scales launch, no bf16 copy written and read back); only an RMSNorm
    consumes it."""

    acc: torch.Tensor
    x_scale: torch.Tensor
    weight_scale: torch.Tensor
    dtype: torch.dtype

    def materialize(self) -> torch.Tensor:
        """The tensor fp8_linear would have returned (apply_scales, no bias)."""
        return apply_scales(self.acc, self.x_scale, self.weight_scale, None, self.dtype)


def fp8_linear(x: torch.Tensor | QuantizedActivation, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, fp8_gemm: str = "auto",
               defer_scales: bool = False) -> torch.Tensor | ScaledAccumulator:
    """y = x W^T (+ b) with W [N, K] fp8 and its per-channel scale [N]; x [..., K] in the model dtype, or a
    2-D QuantizedActivation (its quantization done). fp8_gemm picks the tensor-core GEMM where there is one
    (FP8_GEMMS); the reference path ignores it. defer_scales (only for a caller whose next step is an RMSNorm):
    where the GEMM is cuBLASLt's unscaled one, x is 2-D and there is no bias, return y as a ScaledAccumulator;
    everywhere else a tensor."""
    if isinstance(x, QuantizedActivation):
        lead, (xq, x_scale), dtype = x.q.shape[:-1], (x.q, x.scale), x.dtype
    else:
        lead, dtype = x.shape[:-1], x.dtype
        if x.dim() != 2 or x.stride(-1) != 1:
            x = x.reshape(-1, x.shape[-1]).contiguous()
        xq, x_scale = quantize_per_token(x)
    n, k = weight.shape
    if scaled_mm_supported(xq.device, dtype) and n % 16 == 0 and k % 16 == 0:  # _scaled_mm's shape rule
        gemm = tensor_core_gemm(fp8_gemm, xq.shape[0], n, sm_count(xq.device.index or 0))
        if gemm in ("cublaslt", "cublaslt-fast"):
            if defer_scales and bias is None and len(lead) == 1:
                acc = unscaled_gemm(xq, weight, fast_accum=gemm == "cublaslt-fast")
                return ScaledAccumulator(acc, x_scale, weight_scale, dtype)
            y = unscaled_mm(xq, x_scale, weight, weight_scale, bias, dtype, fast_accum=gemm == "cublaslt-fast")
        elif gemm == "triton":
            from railyard.engine.runner.kernels.fp8_gemm import fp8_gemm as triton_fp8_gemm

            y = triton_fp8_gemm(xq, x_scale, weight, weight_scale, bias, dtype)
        else:
            y = scaled_mm(xq, x_scale, weight, weight_scale, bias, dtype, fast_accum=gemm == "rowwise-fast")
    else:
        y = dequantized_linear(xq, x_scale, weight, weight_scale, bias, dtype)
    return y.view(*lead, n)


def scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
              bias: torch.Tensor | None, dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """The FP8 tensor-core GEMM: (xq W^T) * x_scale * weight_scale (+ bias), accumulated in float32 (fast_accum:
    the MMA's reduced-precision accumulator, promoted to float32 less often; see the module docstring).

    _scaled_mm wants its first operand row-major, its second column-major (W^T of a row-major W is),
    row-wise scales as [M, 1] and [1, N] float32, and K and N multiples of 16."""
    return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), bias=bias,
                            out_dtype=dtype, use_fast_accum=fast_accum)


_UNIT_SCALES: dict[torch.device, torch.Tensor] = {}


def unit_scale(device: torch.device) -> torch.Tensor:
    """A float32 1.0 on `device`, one per device, for the scalar scales of the unscaled GEMM. Made outside any CUDA
    graph capture: one first made while a graph is captured would be filled only when that graph replays, so that
    case raises NeedsWarmUp (graph_capture.capture_each then runs the size eagerly first: the first size captured
    may take the row-wise GEMM, and only a smaller one this GEMM), not a silently uninitialised scale."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    one = _UNIT_SCALES.get(device)
    if one is None:
        if device.type == "cuda" and capturing():
            raise NeedsWarmUp("unit_scale: first asked for inside a CUDA graph capture; run the layer eagerly first")
        one = _UNIT_SCALES[device] = torch.ones((), dtype=torch.float32, device=device)
    return one


def unscaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype, acc_dtype: torch.dtype = torch.float32,
                fast_accum: bool = False) -> torch.Tensor:
    """The same product as scaled_mm through cuBLASLt: torch sends scalar scales there, so the GEMM runs with unit
    scales into float32 (exact sums of e4m3 products, no rounding to bf16 before the scales) and apply_scales
    then multiplies by the per-token and per-channel scales, adds the bias and casts, as scaled_mm's epilogue.
    acc_dtype bfloat16 halves the traffic of that intermediate (a 256-token gate_up writes and reads 39 MB of
    float32) for a second bf16 rounding (2^-9 relative, against e4m3's 2^-4); the sweep measures both. fast_accum:
    as scaled_mm's."""
    return apply_scales(unscaled_gemm(xq, weight, acc_dtype, fast_accum), x_scale, weight_scale, bias, dtype)


def unscaled_gemm(xq: torch.Tensor, weight: torch.Tensor, acc_dtype: torch.dtype = torch.float32,
                  fast_accum: bool = False) -> torch.Tensor:
    """unscaled_mm's GEMM alone: xq W^T [M, N] in acc_dtype, unit scales (the sums of the e4m3 products)."""
    one = unit_scale(xq.device)
    return torch._scaled_mm(xq, weight.t(), scale_a=one, scale_b=one, out_dtype=acc_dtype, use_fast_accum=fast_accum)


def apply_scales_ref(acc: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """acc [M, N] -> dtype((float32(acc) * x_scale[M, 1]) * weight_scale[N] (+ float32(bias))); plain torch, the
    oracle of the Triton kernel (the same float32 operations in the same order)."""
    y = acc.float() * x_scale * weight_scale.view(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def apply_scales(acc: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """apply_scales_ref in one Triton pass on CUDA (torch's would be three or four kernels over [M, N])."""
    ops = fp8_ops() if acc.is_cuda else None
    if ops is not None:
        return ops.apply_scales_triton(acc, x_scale, weight_scale, bias, dtype)
    return apply_scales_ref(acc, x_scale, weight_scale, bias, dtype)


def dequantized_linear(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The reference path: the same quantized numbers, dequantized to `dtype`, through an ordinary matmul."""
    x = (xq.to(torch.float32) * x_scale).to(dtype)
    w = (weight.to(torch.float32) * weight_scale[:, None]).to(dtype)
    return F.linear(x, w, bias)


# -- the KV cache ---------------------------------------------------------------------------------
def quantize_kv(x: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """New keys or values as the cache stores them: times the float32 reciprocal of the layer's scale and cast when
    the cache is FP8 (kernels.paged_attention.store_kv does the same), a plain cast otherwise (a bf16 cache under
    a float32 model)."""
    if cache_dtype == FP8:  # NaN as 0, as store_kv: an FP8 cache holds no NaN byte (kernels/paged_attention.py)
        return to_fp8(torch.nan_to_num(x.float() * reciprocal(scale), nan=0.0))
    return x.to(cache_dtype)


def cache_bits(cache: torch.Tensor) -> torch.Tensor:
    """An FP8 cache as raw bytes: indexing and copies on them are exact and need no float8 kernels."""
    return cache.view(torch.uint8) if cache.dtype == FP8 else cache
