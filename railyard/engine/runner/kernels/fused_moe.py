"""Fused mixture-of-experts on the GPU: tokens grouped by expert, one grouped GEMM per projection.

As vLLM's fused_moe (written here anew):
1. align_by_expert (kernels/moe_align.py) lists the T * k (token, expert) slots by expert and pads each expert's
   run to a multiple of BLOCK_M with a sentinel slot, so every BLOCK_M rows of the sorted list belong to one expert;
2. the gate/up GEMM: each program takes one BLOCK_M row block (one expert) and one BLOCK_N column block, gathers
   its tokens' rows of x, multiplies by that expert's w13 and writes the slots' rows [T * k, 2I];
3. the activation (silu_and_mul, or the layer's own) -> [T * k, I]. The layers' gated ones (SiLU-and-mul,
   gpt-oss's ClampedSwiGLU: epilogue_activation) run in step 2's epilogue instead: each program's column block is
   BLOCK_N / 2 gate rows of w13 and the up rows of the same outputs, and it writes their activation, [T * k, I],
   never the [T * k, 2I] projection (FP8 experts quantize the activation for the down GEMM: theirs runs apart);
4. the down GEMM the same way over w2 -> [T * k, H];
5. the k slots of each token weighted by their routing weights and summed -> [T, H] (sum_slots). (The weights in
   the down GEMM's epilogue cost the register-capped decode tile spills.)
No host sync and fixed shapes for a given T: the sorted list is sized for the worst case (each of the
min(E, T * k) experts that can be hit padded by BLOCK_M - 1), the blocks past the real padded length (a device
scalar) exit at once. So one captured CUDA graph per padded token count replays any routing.

FP8 experts (block scales, layers/fp8_block.py): the activations are quantized per token and 128-wide group, the
GEMM takes BLOCK_K = 128 and multiplies each K step's partial product by the token's group scale and the weight
block's scale before adding it to the float32 accumulator (DeepSeek-V3's recipe, vLLM's w8a8 block path).

MXFP4 experts (gpt-oss, layers/mxfp4.py): the GEMM reads each weight tile packed, 4 bits a weight, as the checkpoint
packs it (one e8m0 exponent per 32-weight group), or, as the engine holds them (kernel_layout), with each group's
bytes in the order the MMA's register fragments take them (layers/mxfp4.py's to_kernel_layout): then a thread's
bytes of a tile come from shared memory in one load rather than one a byte, and the tile is put back in K order in
registers. On bf16 activations (the models' dtype) it is tl.dot_scaled: on Hopper, which has no FP4 MMA, Triton
widens the tile in the registers that feed the tensor cores (its own e2m1 conversion and one bf16 multiply by the
group's scale: exact) and makes the weights the MMA's register operand and the activations its shared-memory one, so
the widened weights never pass through shared memory (whether ptxas keeps the MMAs in flight beside the next
widening or waits for each depends on the tile: scripts/dev/moe_kernel_resources.py says). Other activation dtypes
(float32 in tests, fp16) widen the tile to float32 from the codes' bits and take tl.dot. That widening is paid per
weight and per output tile, so a step with MXFP4_WIDEN_SLOTS_PER_EXPERT slots or more per expert (a long prefill)
widens each projection's experts once into a transient buffer (kernels/mxfp4_widen.py) and takes the dense-weight
GEMM instead; the model keeps no widened copy. The MMAs' width is the row block's (the tokens are the MMA's N
dimension), and a block is sized for the experts that get more than the average: a block whose slots end by its middle
row (an expert's slots come first in its run) multiplies only that half, so an expert with fewer slots than the block
pays half the tensor-core work without being read or widened twice.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from railyard.engine.runner.kernels.fused import clamped_swiglu_values, silu_mul_values
from railyard.engine.runner.kernels.moe_align import align_by_expert
# the GPU's routers, for moe_ops()
from railyard.engine.runner.kernels.moe_routing import route_softmax_topk, route_topk_softmax  # noqa: F401
from railyard.engine.runner.kernels.mxfp4_widen import e2m1_values, e8m0_values, in_k_order, widen_mxfp4
from railyard.engine.runner.layers.activation import ClampedSwiGLU, silu_and_mul
from railyard.engine.runner.layers.fp8_block import quantize_per_token_group
from railyard.engine.runner.layers.mxfp4 import GROUP as MXFP4_GROUP
from railyard.model.spec import EXPERT_BLOCK, widens_mxfp4

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by the slots an expert gets on average (T * k / E): row blocks
# no taller than that while the GEMMs stream the experts' weights (decode: padding each expert hit to 64 rows would
# multiply the work per weight byte), wide tiles and deep pipelines once they are bound by the tensor cores. The
# shapes follow vLLM's tuned table for 128 experts of 768 (Qwen3-30B-A3B) on the H200, keyed there by T at top-8;
# a handful of tiles, so the kernels compiled stay bounded whatever the token count.
TILES = ((2, (16, 64, 128, 4, 3)), (8, (16, 128, 128, 4, 2)), (16, (32, 256, 128, 4, 2)), (32, (64, 128, 64, 4, 3)))
LARGE = (128, 256, 64, 8, 4)
# FP8 block scales take one 128-wide K step per scale
FP8_TILES = ((8, (16, 128, 128, 4, 3)),)
FP8_LARGE = (64, 128, 128, 4, 4)
SMALL = TILES[0][1]
# MXFP4 weights are widened in registers, a cost per weight and per thread: tiles whose widened weights fit beside
# the accumulator without spilling (compiled for sm_90: scripts/dev/moe_kernel_resources.py), 8 warps for the two
# largest, the 64-row one held to 80 registers a thread (Triton's maxnreg) so that three of its blocks share an SM;
# BLOCK_K whole 32-weight groups; picked by timing gpt-oss-20b's experts in CUDA graphs (scripts/dev/moe_sweep.py,
# moe_kernel_ab.py). Past 32 slots per expert the tall one serves (a 512-token step of gpt-oss-20b is
# as fast on it as on the 64-row tiles, a 1,024-token one faster); from MXFP4_WIDEN_SLOTS_PER_EXPERT the experts are
# widened.
MXFP4_TILES = ((8, (16, 64, 128, 4, 3)), (16, (32, 64, 128, 4, 3)), (32, (64, 128, 64, 8, 4, 80)))
MXFP4_LARGE = (128, 128, 64, 8, 3)
# Row blocks this tall (a long step's) read bf16 / fp16 weights through the tensor memory accelerator
# (weight_descriptor)
TMA_BLOCK_M = 128
# Packed MXFP4 weights in the kernel layout come through it in row blocks this short (mxfp4_descriptor), where the
# warps' issue slots, not the tensor cores, bound the tile; taller ones read them by pointer copies, as fast there
MXFP4_TMA_BLOCK_M = 32
# The tables are for 2-byte activations. A pipeline stage holds an A tile and a B tile in shared memory, so 4-byte
# (float32) ones double it: past this budget (under Hopper's 227 KiB per block, with room for Triton's own) a tile
# loses pipeline stages, then halves BLOCK_K, until it fits.
SHARED_MEMORY_BUDGET = 200 * 1024


def fit_shared_memory(tile: tuple[int, ...], element_bytes: int,
                      budget: int = SHARED_MEMORY_BUDGET) -> tuple[int, ...]:
    """The tile with as many stages and as long a K step as its operand tiles of `element_bytes` allow."""
    bm, bn, bk, warps, stages, *cap = tile
    while stages * (bm * bk + bk * bn) * element_bytes > budget:
        if stages > 2:
            stages -= 1
        elif bk > 32:
            bk //= 2
        else:
            break
    return bm, bn, bk, warps, stages, *cap


def pick_config(slots: int, num_experts: int, fp8: bool, mxfp4: bool = False,
                element_bytes: int = 2) -> tuple[int, ...]:
    """The tile for T * k = `slots` (token, expert) pairs over num_experts experts (the tables above), fitted to
    shared memory for activations of `element_bytes` (FP8's K step is its scale block's: its tiles stay)."""
    per_expert = slots / num_experts
    tiles, large = (MXFP4_TILES, MXFP4_LARGE) if mxfp4 else (FP8_TILES, FP8_LARGE) if fp8 else (TILES, LARGE)
    tile = next((tile for most, tile in tiles if per_expert <= most), large)
    return tile if fp8 else fit_shared_memory(tile, element_bytes)


@triton.jit
def _mxfp4_widened(packed, exponents, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """Packed bytes [BLOCK_K / 2, BLOCK_N] (low nibble first along K) and their exponents [BLOCK_N, BLOCK_K / GROUP]
    -> the float32 weights [BLOCK_K, BLOCK_N] (what dot_scaled widens to bf16 in its own registers)."""
    scale = e8m0_values(tl.trans(exponents).to(tl.uint32))
    scale = tl.reshape(tl.broadcast_to(scale[:, None, :], (BLOCK_K // GROUP, GROUP // 2, BLOCK_N)),
                       (BLOCK_K // 2, BLOCK_N))
    codes = packed.to(tl.uint32)
    pairs = tl.join(e2m1_values(codes & 15) * scale, e2m1_values(codes >> 4) * scale)  # [K / 2, N, 2]
    return tl.reshape(tl.permute(pairs, (0, 2, 1)), (BLOCK_K, BLOCK_N))


@triton.jit
def program_block(pid, num_programs, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid` of a grid of (row blocks) x cdiv(N, BLOCK_N) -> its (row block, column block), in grouped
    order: GROUP_M row blocks sweep the column blocks together, so that what they share (an expert's weights, a row
    block's activations) is read again while L2 still holds it. scripts/dev/mxfp4_moe_gluon.py runs it too."""
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    num_m = num_programs // num_n
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % group) % size_m, (pid % group) // size_m


# The activations the gate/up GEMM's epilogue applies (grouped_gemm's `gated`)
SILU_AND_MUL: tl.constexpr = tl.constexpr(1)
CLAMPED_SWIGLU: tl.constexpr = tl.constexpr(2)


def epilogue_activation(activation) -> tuple[int, float, float] | None:
    """A layer's activation -> grouped_gemm's `gated` (kind, alpha, limit), or None for one it does not know (run on
    the stored projection): SiLU-and-mul (the MoE layer's default) and gpt-oss's ClampedSwiGLU."""
    if isinstance(activation, ClampedSwiGLU):
        return CLAMPED_SWIGLU.value, activation.alpha, activation.limit
    if activation is silu_and_mul:
        return SILU_AND_MUL.value, 0.0, 0.0
    return None


@triton.jit
def _store_rows(acc, c_ptr, slot, valid, rn, N, expert, bias_ptr, stride_biase, weights_ptr, stride_cm, out_cols,
                alpha, limit, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, GATED: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue: the expert's bias, the slot's routing weight, the rows stored at their slots. GATED (an
    activation kind, epilogue_activation's): the tile's columns are gate rows then the matching up rows of w
    (gated_rows), and what is stored is their activation (SiLU-and-mul, or gpt-oss's clamped SwiGLU with alpha and
    limit) at output columns out_cols, from gate and up rounded to the output dtype first, as the unfused
    activation reads them from the stored gate/up projection: the same numbers, one [slots, N / 2] write instead of
    a [slots, N] write and its read back."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_biase + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + slot, mask=valid, other=0.0).to(tl.float32)[:, None]
    dtype = c_ptr.dtype.element_ty
    if GATED:
        gate, up = tl.split(tl.permute(tl.reshape(acc.to(dtype), (ROWS, 2, BLOCK_N // 2)), (0, 2, 1)))
        if GATED == CLAMPED_SWIGLU:
            out = clamped_swiglu_values(gate, up, alpha, limit, dtype)
        else:
            out = silu_mul_values(gate, up)
        c_ptrs = c_ptr + slot[:, None].to(tl.int64) * stride_cm + out_cols[None, :]
        tl.store(c_ptrs, out.to(dtype), mask=valid[:, None] & (out_cols[None, :] < N // 2))
    else:
        c_ptrs = c_ptr + slot[:, None].to(tl.int64) * stride_cm + rn[None, :]
        tl.store(c_ptrs, acc.to(dtype), mask=valid[:, None] & (rn[None, :] < N))


@triton.jit
def gated_rows(pid_n, N, BLOCK_N: tl.constexpr):
    """Column block pid_n of a gated projection (w's N rows: gate rows, then up rows) -> (the BLOCK_N rows of w it
    multiplies: BLOCK_N / 2 gate rows and the up rows of the same outputs, the output columns they make)."""
    HALF: tl.constexpr = BLOCK_N // 2
    j = tl.arange(0, BLOCK_N)
    out_cols = pid_n * HALF + tl.arange(0, HALF)
    return pid_n * HALF + j % HALF + (j // HALF) * (N // 2), out_cols


@triton.jit
def _mxfp4_rows(a_ptr, b_ptr, c_ptr, b_scale_ptr, bias_ptr, weights_ptr, sorted_ptr, b_desc, first, expert, pid_n, rn,
                N, K, num_slots, stride_am, stride_be, stride_bn, stride_cm, stride_bse, stride_bsn, stride_biase,
                out_cols, alpha, limit, A_ROW_DIV: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr, KERNEL_LAYOUT: tl.constexpr, GATED: tl.constexpr,
                B_TMA: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP: tl.constexpr):
    """ROWS rows of the sorted list from `first` times the expert's packed MXFP4 tile [BLOCK_N, K], stored.
    B^T tile [K / 2, N] of packed bytes (byte j of a group: weights 2j, 2j + 1), exponents [N, K / 32]. In the kernel
    layout (layers/mxfp4.py) the tile is read as stored, [N, K / 2], and its groups' bytes put back in K order in
    registers, where the MMA's fragments find each thread's bytes side by side. B_TMA (kernel layout): the packed
    tiles come by the tensor memory accelerator through b_desc (mxfp4_descriptor), zeros past K and N."""
    slot = tl.load(sorted_ptr + first + tl.arange(0, ROWS))
    valid = slot < num_slots
    row = (slot // A_ROW_DIV).to(tl.int64)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    rk = tl.arange(0, BLOCK_K)
    rj = tl.arange(0, BLOCK_K // 2)
    rg = tl.arange(0, BLOCK_K // GROUP)
    a_ptrs = a_ptr + row[:, None] * stride_am + rk[None, :]
    n_in = rn < N
    if KERNEL_LAYOUT:  # the packed tile's rows and byte columns, [N, K / 2] as stored or [K / 2, N]
        b_n, b_j = rn[:, None], rj[None, :]
        b_n_in = n_in[:, None]
    else:
        b_n, b_j = rn[None, :], rj[:, None]
        b_n_in = n_in[None, :]
    b_ptrs = b_ptr + expert * stride_be + b_n.to(tl.int64) * stride_bn + b_j
    # The exponents are a byte a thread, too narrow for the pipeline's asynchronous copies: each K step loads
    # the next step's, so that their latency passes under this step's work rather than before it.
    s_ptrs = b_scale_ptr + expert * stride_bse + rn[:, None].to(tl.int64) * stride_bsn + rg[None, :]
    exponents = tl.load(s_ptrs, mask=n_in[:, None] & (rg[None, :] * GROUP < K), other=0)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        s_ptrs += BLOCK_K // GROUP
        upcoming = tl.load(s_ptrs, mask=n_in[:, None] & (rg[None, :] * GROUP < K - (k + 1) * BLOCK_K), other=0)
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
        else:  # K ends inside this tile, on a whole group (a permuted group is whole too)
            k_left = tl.multiple_of(K - k * BLOCK_K, GROUP)
            a = tl.load(a_ptrs, mask=valid[:, None] & (rk[None, :] < k_left), other=0.0)
        if B_TMA:
            SPLIT: tl.constexpr = 2 if GATED else 1
            packed = tl.reshape(b_desc.load([expert.to(tl.int32), 0, pid_n * (BLOCK_N // SPLIT),
                                             k * (BLOCK_K // 2)]), (BLOCK_N, BLOCK_K // 2))
        elif EVEN_K:
            packed = tl.load(b_ptrs, mask=b_n_in, other=0)
        else:
            packed = tl.load(b_ptrs, mask=b_n_in & (b_j < k_left // 2), other=0)
        if KERNEL_LAYOUT:  # [N, K / 2] as the engine holds it -> [K / 2, N] in K order
            packed = tl.trans(in_k_order(packed, BLOCK_N, BLOCK_K // 2))
        if a_ptr.dtype.element_ty == tl.bfloat16:
            acc = tl.dot_scaled(a, None, "bf16", packed, exponents, "e2m1", acc, fast_math=True)
        else:
            acc = tl.dot(a, _mxfp4_widened(packed, exponents, BLOCK_K, BLOCK_N, GROUP).to(a.dtype), acc,
                         input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K // 2
        exponents = upcoming
    _store_rows(acc, c_ptr, slot, valid, rn, N, expert, bias_ptr, stride_biase, weights_ptr, stride_cm, out_cols,
                alpha, limit, HAS_BIAS, MUL_WEIGHT, GATED, ROWS, BLOCK_N)


@triton.jit(do_not_specialize=["num_slots"])  # one compiled kernel for every token count
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, weights_ptr, sorted_ptr,
                         block_expert_ptr, padded_len_ptr, b_desc, N, K, num_slots, stride_am, stride_be, stride_bn,
                         stride_cm, stride_asm, stride_bse, stride_bsn, stride_biase, SPLIT_N, SPLIT_BLOCKS,
                         alpha, limit,
                         A_ROW_DIV: tl.constexpr, FP8: tl.constexpr, MXFP4: tl.constexpr, HAS_BIAS: tl.constexpr,
                         MUL_WEIGHT: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
                         KERNEL_LAYOUT: tl.constexpr, HALF_ROWS: tl.constexpr, GATED: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_N: tl.constexpr,
                         GROUP_M: tl.constexpr, GROUP: tl.constexpr, B_TMA: tl.constexpr):
    """C[slot, n] = (sum_k A[slot // A_ROW_DIV, k] * B[expert(slot), n, k] (+ bias[expert, n])) (* weight[slot]).
    MXFP4: B is packed, [E, N, K / 2] bytes, with exponents [E, N, K / 32] at b_scale_ptr; with HALF_ROWS a block
    whose slots fit its first BLOCK_M / 2 rows (an expert's slots come first in its run) multiplies only those.
    GATED (not FP8): B's rows are gate rows then up rows, and C [slots, N / 2] is their activation (_store_rows).
    B_TMA: B's tiles come by the tensor memory accelerator through b_desc, a descriptor of B viewed [E, G, N / G, K]
    (bf16 / fp16 weights; MXFP4 ones [E, G, N / G, K / 2] bytes in the kernel layout; G = 2 gated: a tile's gate rows
    and up rows, else 1), rather than by pointers."""
    if GATED:
        pid_m, pid_n = program_block(tl.program_id(0), tl.num_programs(0), N // 2, BLOCK_N // 2, GROUP_M)
        rn, out_cols = gated_rows(pid_n, N, BLOCK_N)
    else:
        pid_m, pid_n = program_block(tl.program_id(0), tl.num_programs(0), N, BLOCK_N, GROUP_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out_cols = rn
    if pid_m * BLOCK_M >= tl.load(padded_len_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if MXFP4:
        first = pid_m * BLOCK_M
        if HALF_ROWS:
            half = tl.load(sorted_ptr + first + BLOCK_M // 2) >= num_slots
        else:
            half = False
        if half:
            _mxfp4_rows(a_ptr, b_ptr, c_ptr, b_scale_ptr, bias_ptr, weights_ptr, sorted_ptr, b_desc, first, expert,
                        pid_n, rn, N, K, num_slots, stride_am, stride_be, stride_bn, stride_cm, stride_bse,
                        stride_bsn, stride_biase, out_cols, alpha, limit, A_ROW_DIV, HAS_BIAS, MUL_WEIGHT,
                        DOT_PRECISION, EVEN_K, KERNEL_LAYOUT, GATED, B_TMA, BLOCK_M // 2, BLOCK_N, BLOCK_K, GROUP)
        else:
            _mxfp4_rows(a_ptr, b_ptr, c_ptr, b_scale_ptr, bias_ptr, weights_ptr, sorted_ptr, b_desc, first, expert,
                        pid_n, rn, N, K, num_slots, stride_am, stride_be, stride_bn, stride_cm, stride_bse,
                        stride_bsn, stride_biase, out_cols, alpha, limit, A_ROW_DIV, HAS_BIAS, MUL_WEIGHT,
                        DOT_PRECISION, EVEN_K, KERNEL_LAYOUT, GATED, B_TMA, BLOCK_M, BLOCK_N, BLOCK_K, GROUP)
    else:
        slot = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = slot < num_slots
        row = (slot // A_ROW_DIV).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + row[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + expert * stride_be + rn[None, :].to(tl.int64) * stride_bn + rk[:, None]  # B^T tile [K, N]
        if FP8:
            a_scale_ptrs = a_scale_ptr + row * stride_asm
            scale_row = (rn // SPLIT_N) * SPLIT_BLOCKS + (rn % SPLIT_N) // SCALE_N
            b_scale_ptrs = b_scale_ptr + expert * stride_bse + scale_row * stride_bsn
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=valid[:, None] & (rk[None, :] < k_left), other=0.0)
            if B_TMA:  # rows past the expert's N are another expert's (or zeros): their columns are not stored
                SPLIT: tl.constexpr = 2 if GATED else 1
                b = tl.trans(tl.reshape(b_desc.load([expert.to(tl.int32), 0, pid_n * (BLOCK_N // SPLIT),
                                                     k * BLOCK_K]), (BLOCK_N, BLOCK_K)))
            else:
                b = tl.load(b_ptrs, mask=(rn[None, :] < N) & (rk[:, None] < k_left), other=0.0)
            if FP8:
                a_s = tl.load(a_scale_ptrs + k, mask=valid, other=0.0)
                b_s = tl.load(b_scale_ptrs + k, mask=rn < N, other=0.0)
                acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
            else:
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        _store_rows(acc, c_ptr, slot, valid, rn, N, expert, bias_ptr, stride_biase, weights_ptr, stride_cm, out_cols,
                    alpha, limit, HAS_BIAS, MUL_WEIGHT, GATED, BLOCK_M, BLOCK_N)


@triton.jit  # hidden is the model's: specialized on its divisibility, the loads are vectors
def _sum_slots_kernel(slots_ptr, weights_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
                      WEIGHTED: tl.constexpr):
    """out[t] = sum_j slots[t * TOP_K + j] (* weights[t * TOP_K + j]), in float32, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        slot = tl.load(slots_ptr + (t * TOP_K + j) * hidden + h, mask=h < hidden, other=0.0).to(tl.float32)
        if WEIGHTED:
            slot = slot * tl.load(weights_ptr + t * TOP_K + j).to(tl.float32)
        acc += slot
    tl.store(out_ptr + t * hidden + h, acc.to(out_ptr.dtype.element_ty), mask=h < hidden)


def sum_slots(slots: torch.Tensor, top_k: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[T * k, H] -> [T, H], each token's k slots (times their routing weights [T * k], if given) summed in float32
    and rounded once, in one launch: a read of the slots and a write, in 16-byte vectors where H allows (torch's sum
    over a middle dimension of k reads them less efficiently)."""
    num_tokens, hidden = slots.shape[0] // top_k, slots.shape[1]
    out = torch.empty((num_tokens, hidden), dtype=slots.dtype, device=slots.device)
    block_h = min(1024, triton.next_power_of_2(hidden))
    _sum_slots_kernel[(num_tokens, triton.cdiv(hidden, block_h))](
        slots, weights if weights is not None else slots, out, hidden, TOP_K=top_k, BLOCK_H=block_h,
        WEIGHTED=weights is not None, num_warps=4, enable_fp_fusion=False)  # a product, then a sum: no FMA
    return out


def _stacked_descriptor(w: torch.Tensor, block_n: int, box_cols: int, gated: bool) -> TensorDescriptor | None:
    """A tensor-memory-accelerator descriptor of stacked expert weights [E, N, C] (C: a row's elements), viewed
    [E, G, N / G, C] with G = 2 gated (a tile's gate rows and up rows, two boxes of one load), boxes of block_n rows
    by box_cols; None where the copy engine cannot address them (not contiguous, rows or a box's row not 16-byte
    multiples, gate and up halves unequal), or GPUs before Hopper."""
    split = 2 if gated else 1
    num_experts, n, cols = w.shape
    if (not w.is_contiguous() or (cols * w.element_size()) % 16 or (box_cols * w.element_size()) % 16
            or w.data_ptr() % 16 or n % split or block_n % split
            or (w.is_cuda and torch.cuda.get_device_capability(w.device) < (9, 0))):
        return None
    return TensorDescriptor.from_tensor(w.view(num_experts, split, n // split, cols),
                                        [1, split, block_n // split, box_cols])


def weight_descriptor(w: torch.Tensor, block_m: int, block_n: int, block_k: int,
                      gated: bool) -> TensorDescriptor | None:
    """A descriptor (_stacked_descriptor) of bf16 / fp16 expert weights [E, N, K] for the tall row blocks
    (BLOCK_M >= TMA_BLOCK_M, a long step's, bound by the tensor cores: the copy engine's loads leave the warps
    their issue slots and registers); None where the pointer loads serve: shorter tiles, other dtypes, K not whole
    tiles, weights the copy engine cannot address, GPUs before Hopper."""
    if block_m < TMA_BLOCK_M or w.dtype not in (torch.bfloat16, torch.float16) or w.shape[2] % block_k:
        return None
    return _stacked_descriptor(w, block_n, block_k, gated)


def mxfp4_descriptor(w: torch.Tensor, block_n: int, block_k: int, gated: bool) -> TensorDescriptor | None:
    """A descriptor (_stacked_descriptor) of packed MXFP4 expert weights [E, N, K / 2] held in the kernel layout,
    for the short row blocks (MXFP4_TMA_BLOCK_M): the copy engine fetches a K step's packed bytes (zeros past the
    rows' ends) while the warps widen the step before, where pointer copies cost them issue slots and registers.
    None where the copy engine cannot address them (a box row of block_k / 2 bytes under 16 among them)."""
    return _stacked_descriptor(w, block_n, block_k // 2, gated)


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, routing, a_row_div: int,
                 config: tuple[int, ...], bias: torch.Tensor | None = None,
                 weights: torch.Tensor | None = None, a_scale: torch.Tensor | None = None,
                 w_scale: torch.Tensor | None = None, split_n: int | None = None,
                 kernel_layout: bool = False, half_rows: bool | None = None,
                 gated: tuple[int, float, float] | None = None) -> torch.Tensor:
    """out[slot] = A[slot // a_row_div] @ w[expert(slot)]^T (+ bias[expert]) (* weights[slot]) for every slot of
    `routing` (align_by_expert's output). FP8: a and w e4m3 with a_scale [rows, K/128] and w_scale [E, nb, kb]
    (split_n: the rows of each projection stacked in w, whose scale rows restart at each). MXFP4: w uint8 [E, N,
    K/2] (two e2m1 codes a byte; kernel_layout: in layers/mxfp4.py's to_kernel_layout order, else the
    checkpoint's) with w_scale uint8 [E, N, K/32] (e8m0 exponents); a in the model's dtype. gated (not FP8;
    epilogue_activation's (kind, alpha, limit)): w's rows are gate rows then up rows, and out [slots, N / 2] is their
    activation, made in the epilogue."""
    sorted_slots, block_experts, padded_len = routing
    bm, bn, bk, warps, stages, *cap = config
    mxfp4 = w.dtype == torch.uint8
    n, k = w.shape[1], w.shape[2] * (2 if mxfp4 else 1)
    if a.stride(-1) != 1 or w.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("grouped_gemm wants operands whose rows are contiguous")
    fp8 = a_scale is not None
    if fp8:
        assert bk == EXPERT_BLOCK[1], "FP8 experts take one K step per scale block"
    if mxfp4:
        assert w_scale is not None and w_scale.stride(-1) == 1 and k == w_scale.shape[2] * MXFP4_GROUP
        assert bk % MXFP4_GROUP == 0, "an MXFP4 K step covers whole 32-weight groups"
    if gated is not None:
        assert not fp8 and n % 2 == 0 and out.shape[1] == n // 2, "a gated projection is [gate | up] -> N / 2"
    split = split_n or n
    grid = (block_experts.numel() * (triton.cdiv(n // 2, bn // 2) if gated else triton.cdiv(n, bn)),)
    kind, alpha, limit = gated or (0, 0.0, 0.0)
    scaled = fp8 or mxfp4
    if mxfp4:
        tma = kernel_layout and bm <= MXFP4_TMA_BLOCK_M
        b_desc = mxfp4_descriptor(w, bn, bk, gated is not None) if tma else None
    else:
        b_desc = weight_descriptor(w, bm, bn, bk, gated is not None) if not fp8 else None
    _grouped_gemm_kernel[grid](
        a, w, out, a_scale if fp8 else a, w_scale if scaled else w, bias if bias is not None else w,
        weights if weights is not None else w, sorted_slots, block_experts, padded_len, b_desc, n, k, out.shape[0],
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        a_scale.stride(0) if fp8 else 0, w_scale.stride(0) if scaled else 0, w_scale.stride(1) if scaled else 0,
        bias.stride(0) if bias is not None else 0, split, -(-split // EXPERT_BLOCK[0]), alpha, limit,
        A_ROW_DIV=a_row_div, FP8=fp8, MXFP4=mxfp4, HAS_BIAS=bias is not None, MUL_WEIGHT=weights is not None,
        # float32 models multiply in float32 (Triton's default there is TF32), as the reference and HF do
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32", EVEN_K=k % bk == 0,
        KERNEL_LAYOUT=mxfp4 and kernel_layout, HALF_ROWS=mxfp4 and bm >= 32 and half_rows is not False,
        GATED=kind,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SCALE_N=EXPERT_BLOCK[0], GROUP_M=8, GROUP=MXFP4_GROUP, num_warps=warps,
        num_stages=stages, B_TMA=b_desc is not None,
        **({"maxnreg": cap[0]} if cap else {}))
    return out


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation, w13_bias: torch.Tensor | None = None,
                  w2_bias: torch.Tensor | None = None, w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None,
                  config: tuple[int, ...] | None = None, widen: bool | None = None,
                  kernel_layout: bool = False) -> torch.Tensor:
    """layers/moe.py's experts contract on the GPU: x [T, H] -> [T, H], this rank's partial sums (the module
    docstring's five steps). FP8 when the weights are e4m3 (with their block scales); MXFP4 when they are packed
    uint8 (with their exponents; kernel_layout: their bytes in layers/mxfp4.py's to_kernel_layout order), read as
    packed inside the GEMMs, or, with `widen` (by default: at MXFP4_WIDEN_SLOTS_PER_EXPERT slots per expert or
    more), each projection widened for this call alone."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden = w13.shape[0], x.shape[1]
    slots = num_tokens * top_k
    if slots == 0:
        return torch.zeros_like(x)
    mxfp4 = w13.dtype == torch.uint8
    fp8 = w13_scale is not None and not mxfp4
    widen = mxfp4 and (widens_mxfp4(slots, num_experts) if widen is None else widen)
    if config is None:
        config = pick_config(slots, num_experts, fp8, mxfp4 and not widen, x.element_size())
    elif not fp8:  # a tile asked for by name is fitted to these activations' shared memory as the tables' are
        config = fit_shared_memory(config, x.element_size())
    routing = align_by_expert(topk_ids, num_experts, config[0])
    # the gated activations run in the gate/up GEMM's epilogue (FP8's quantizes its output: it runs on its own)
    gated = None if fp8 else epilogue_activation(activation)
    gate_up = torch.empty((slots, w13.shape[1] // (2 if gated else 1)), dtype=x.dtype, device=x.device)
    if fp8:
        xq, xs = quantize_per_token_group(x)
        grouped_gemm(xq, w13, gate_up, routing, top_k, config, w13_bias, None, xs, w13_scale, w13.shape[1] // 2)
    elif widen:  # the widened projection is freed once its GEMM is queued (the allocator reuses it in stream order)
        grouped_gemm(x, widen_mxfp4(w13, w13_scale, x.dtype, kernel_layout), gate_up, routing, top_k, config,
                     w13_bias, gated=gated)
    else:
        grouped_gemm(x, w13, gate_up, routing, top_k, config, w13_bias, w_scale=w13_scale,
                     kernel_layout=kernel_layout, gated=gated)
    h = gate_up if gated else activation(gate_up)
    del gate_up
    down = torch.empty((slots, hidden), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1)
    if fp8:
        hq, hs = quantize_per_token_group(h)
        grouped_gemm(hq, w2, down, routing, 1, config, w2_bias, None, hs, w2_scale)
    elif widen:
        grouped_gemm(h, widen_mxfp4(w2, w2_scale, x.dtype, kernel_layout), down, routing, 1, config, w2_bias)
    else:
        grouped_gemm(h, w2, down, routing, 1, config, w2_bias, w_scale=w2_scale, kernel_layout=kernel_layout)
    return sum_slots(down, top_k, weights)
