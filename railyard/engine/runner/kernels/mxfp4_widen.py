"""MXFP4 experts widened to the model's dtype for one large step (kernels/fused_moe.py's prefill path).

The fused experts read MXFP4 weights packed and widen each tile in the registers that feed the tensor cores. That is
the fastest way while a step's GEMMs stream the weights (decode: few rows per expert), but the widening is paid per
weight and per output tile, so once every expert meets hundreds of rows the tensor cores wait on it. For such steps
one projection's experts are widened here into a transient buffer, read once from their packed bytes and written
once, and the dense-weight GEMM runs on it; the buffer goes back to the allocator before the next projection's.
The model keeps no widened copy: weights at rest stay as the checkpoint packs them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from railyard.model.spec import MXFP4_GROUP

BLOCK_ROWS, BLOCK_BYTES = 4, 512  # a program: 4 weight rows of 1,024 weights (32 groups)


@triton.jit
def e2m1_values(codes):
    """e2m1 codes (uint32, 0..15) -> their exact float32 values, from the bits: sign (code bit 3) to bit 31; codes
    2..7 are normal (exponent e, mantissa bit m -> float exponent e + 126, top mantissa bit m); code 1 is 0.5."""
    mag = codes & 7
    bits = tl.where(mag >= 2, (mag << 22) + (126 << 23), tl.where(mag == 1, 126 << 23, 0))
    return (bits | ((codes & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_values(exponents):
    """e8m0 exponents (uint32) -> 2^(e - 127) in float32, from the bits (e = 0: the subnormal 2^-127)."""
    return tl.where(exponents == 0, 1 << 22, exponents << 23).to(tl.float32, bitcast=True)


@triton.jit
def in_k_order(codes, ROWS: tl.constexpr, BYTES: tl.constexpr):
    """Packed bytes [ROWS, BYTES] as the engine holds them (layers/mxfp4.py's to_kernel_layout: a 16-byte group's
    [c, i] holds its byte 4i + c) -> the same bytes in K order, a 4 x 4 transpose within each group in registers.
    The widening kernel and the fused GEMM's packed tiles both read the bytes as they lie and turn them so."""
    return tl.reshape(tl.permute(tl.reshape(codes, (ROWS, BYTES // 16, 4, 4)), (0, 1, 3, 2)), (ROWS, BYTES))


@triton.jit
def _widen_kernel(packed_ptr, exponents_ptr, out_ptr, rows, K, BLOCK_ROWS: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                  GROUP: tl.constexpr, KERNEL_LAYOUT: tl.constexpr):
    """out[r, 2j] / out[r, 2j + 1] = the low / high nibble of packed[r, j] times 2^(exponent[r, 2j / GROUP] - 127)
    (KERNEL_LAYOUT: byte j of a group stored at (j % 4) * 4 + j // 4, layers/mxfp4.py's to_kernel_layout). The bytes
    are loaded as they lie, in 16-byte runs, and a group's put back in K order in registers (a 4 x 4 transpose), as
    the fused GEMM does; each group's exponent is loaded once and broadcast over its bytes."""
    GROUPS: tl.constexpr = BLOCK_BYTES // (GROUP // 2)
    rr = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rj = tl.program_id(1) * BLOCK_BYTES + tl.arange(0, BLOCK_BYTES)
    rg = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    row = rr.to(tl.int64)[:, None]
    row_in = rr[:, None] < rows
    codes = tl.load(packed_ptr + row * (K // 2) + rj[None, :], mask=row_in & (rj[None, :] < K // 2), other=0)
    if KERNEL_LAYOUT:
        codes = in_k_order(codes, BLOCK_ROWS, BLOCK_BYTES)
    codes = codes.to(tl.uint32)
    exponents = tl.load(exponents_ptr + row * (K // GROUP) + rg[None, :], mask=row_in & (rg[None, :] < K // GROUP),
                        other=127)
    scale = tl.reshape(tl.broadcast_to(e8m0_values(exponents.to(tl.uint32))[:, :, None],
                                       (BLOCK_ROWS, GROUPS, GROUP // 2)), (BLOCK_ROWS, BLOCK_BYTES))
    pairs = tl.join(e2m1_values(codes & 15) * scale, e2m1_values(codes >> 4) * scale)  # [rows, bytes, 2]
    values = tl.reshape(pairs, (BLOCK_ROWS, 2 * BLOCK_BYTES))
    rk = tl.program_id(1) * 2 * BLOCK_BYTES + tl.arange(0, 2 * BLOCK_BYTES)
    tl.store(out_ptr + row * K + rk[None, :], values.to(out_ptr.dtype.element_ty), mask=row_in & (rk[None, :] < K))


def widen_mxfp4(packed: torch.Tensor, exponents: torch.Tensor, dtype: torch.dtype,
                kernel_layout: bool = False) -> torch.Tensor:
    """packed uint8 [..., K / 2] (the even weight in the low nibble; kernel_layout: each group's bytes in
    to_kernel_layout's order) and exponents uint8 [..., K / 32] -> the weights [..., K] in `dtype`: layers/mxfp4.py's
    dequantize_mxfp4 in one pass (exact in bf16: an e2m1 value times a power of two)."""
    k = packed.shape[-1] * 2
    if exponents.shape[-1] * MXFP4_GROUP != k or exponents.shape[:-1] != packed.shape[:-1]:
        raise ValueError(f"MXFP4 exponents {tuple(exponents.shape)} do not match packed weights {tuple(packed.shape)}")
    packed, exponents = packed.contiguous(), exponents.contiguous()
    out = torch.empty((*packed.shape[:-1], k), dtype=dtype, device=packed.device)
    rows = packed.numel() // (k // 2)
    if rows:
        grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(k // 2, BLOCK_BYTES))
        _widen_kernel[grid](packed, exponents, out, rows, k, BLOCK_ROWS=BLOCK_ROWS, BLOCK_BYTES=BLOCK_BYTES,
                            GROUP=MXFP4_GROUP, KERNEL_LAYOUT=kernel_layout)
    return out
