"""The fused-MoE grouped GEMM for MXFP4 experts written in Gluon for Hopper, every step of it explicit, as a kernel
file for scripts/dev/moe_kernel_ab.py to time against kernels/fused_moe.py: the same grouped_gemm contract, taken
here for bf16 activations, weights in the kernel's byte order (layers/mxfp4.py), K a whole number of K steps and
exponent rows of an even number of bytes; anything else goes to fused_moe.grouped_gemm.

Why: fused_moe's tl.dot_scaled leaves the widening, its layouts and the MMAs' pipelining to Triton. Here each K
step's packed tile is copied to shared memory (16-byte asynchronous copies, swizzled so that the reads meet no bank
conflict), each thread reads the 32-bit words its wgmma fragments take (the kernel layout puts a thread's eight codes
of a 32-weight group in one word; Triton reads them with ldmatrix), widens them with byte permutes against an e2m1
-> bf16 table held in registers and one bf16x2 multiply by the group's scale (inline PTX, WIDEN_ASM), and the
widened tile is the wgmma's register operand, the activations its shared-memory one; the MMAs run asynchronously,
one in flight beside the next step's widening. The exponents come two steps ahead by direct loads, two bytes a row a
step. Outputs equal fused_moe's bit for bit (same products, same K order). MXFP4_GLUON_NO_WIDEN=1 replaces the
widening by register moves (wrong outputs): the data movement and the MMAs alone, what a faster widening could at
best reach.

    python3 scripts/dev/moe_kernel_ab.py \
        --kernels railyard/engine/runner/kernels/fused_moe.py,scripts/dev/mxfp4_moe_gluon.py
    python3 scripts/dev/moe_kernel_resources.py   # the Triton kernel's registers and K loop, to compare by hand
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,  # noqa: E402
                                                              warpgroup_mma, warpgroup_mma_wait)

from railyard.engine.runner.kernels import fused_moe  # noqa: E402

program_block = gluon.jit(fused_moe.program_block.fn)  # the engine kernel's program order, in Gluon

# One word of eight e2m1 codes (byte i: the thread's fragment elements 2i, 2i + 1, low nibble first) and its group's
# e8m0 exponent e -> eight bf16, code value * 2^(e - 127). The magnitudes' low and high bf16 bytes come from two
# byte-permute tables ($10, $11: registers; the second words are immediates), the signs from a third ($12), then
# each pair is interleaved into a bf16x2 and multiplied by the scale, whose bits are e << 7 in both halves.
WIDEN_ASM = gl.constexpr("""{
.reg .b32 m, s, mh, sh, lo0, lo1, hi0, hi1, sg0, sg1, p0, p1, p2, p3, sc;
and.b32 m, $8, 0x77777777;
and.b32 s, $8, 0x88888888;
shr.u32 s, s, 3;
shr.u32 mh, m, 16;
shr.u32 sh, s, 16;
prmt.b32 lo0, $10, 0xC0804000, m;
prmt.b32 lo1, $10, 0xC0804000, mh;
prmt.b32 hi0, $11, 0x40404040, m;
prmt.b32 hi1, $11, 0x40404040, mh;
prmt.b32 sg0, $12, 0, s;
prmt.b32 sg1, $12, 0, sh;
or.b32 hi0, hi0, sg0;
or.b32 hi1, hi1, sg1;
prmt.b32 p0, lo0, hi0, 0x5140;
prmt.b32 p1, lo0, hi0, 0x7362;
prmt.b32 p2, lo1, hi1, 0x5140;
prmt.b32 p3, lo1, hi1, 0x7362;
mul.lo.u32 sc, $9, 0x00800080;
mul.rn.bf16x2 p0, p0, sc;
mul.rn.bf16x2 p1, p1, sc;
mul.rn.bf16x2 p2, p2, sc;
mul.rn.bf16x2 p3, p3, sc;
mov.b32 {$0, $1}, p0;
mov.b32 {$2, $3}, p1;
mov.b32 {$4, $5}, p2;
mov.b32 {$6, $7}, p3;
}""")
# the data movement and the MMAs alone: the words pass through as if widened (MXFP4_GLUON_NO_WIDEN=1)
MOVE_ASM = gl.constexpr("""{
mov.b32 {$0, $1}, $8;
mov.b32 {$2, $3}, $8;
mov.b32 {$4, $5}, $9;
mov.b32 {$6, $7}, $10;
}""")


@gluon.constexpr_function
def word_layout(BLOCK_N, BLOCK_K, num_warps):
    """[BLOCK_N, BLOCK_K // 8] int32 words: thread (lane r*4+c, warp w) holds the words (n, 4g + c) whose codes feed
    its wgmma A fragments: rows 16w + r (+8) of each 16*num_warps-row repeat."""
    reg = [[8, 0]]
    g = 1
    while 32 * g < BLOCK_K:
        reg.append([0, 4 * g]); g *= 2
    rows = 16 * num_warps
    while rows < BLOCK_N:
        reg.append([rows, 0]); rows *= 2
    lane = [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([w, 0]); w *= 2
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=lane, warp_bases=warp, block_bases=[],
                                      shape=[BLOCK_N, BLOCK_K // 8])


@gluon.constexpr_function
def exponent_layout(BLOCK_N, BLOCK_K, num_warps):
    """[BLOCK_N, BLOCK_K // 32, 4]: word_layout with its word index split into (group, lane column c): the
    exponents [BLOCK_N, groups] are its slice along c, broadcast over the four lanes that share a row."""
    reg = []
    g = 1
    while 32 * g < BLOCK_K:
        reg.append([0, g, 0]); g *= 2
    reg.append([8, 0, 0])
    rows = 16 * num_warps
    while rows < BLOCK_N:
        reg.append([rows, 0, 0]); rows *= 2
    lane = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([w, 0, 0]); w *= 2
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=lane, warp_bases=warp, block_bases=[],
                                      shape=[BLOCK_N, BLOCK_K // 32, 4])


@gluon.jit
def widen_words(words, exponents, table_lo, table_hi, table_sign, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                NO_WIDEN: gl.constexpr):
    """Words [BLOCK_N, BLOCK_K // 8] in word_layout and their exponents (int32, same shape) -> the bf16 tile
    [BLOCK_N, BLOCK_K] in K order, laid out as the wgmma register operand wants it (the caller asserts that the
    conversion to that layout moves nothing): the asm's eight outputs per word are stacked and relabelled only."""
    asm: gl.constexpr = MOVE_ASM if NO_WIDEN else WIDEN_ASM
    o = gl.inline_asm_elementwise(asm, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r",
                                  [words, exponents, table_lo, table_hi, table_sign], dtype=(gl.bfloat16,) * 8,
                                  is_pure=True, pack=1)
    pairs = gl.join(gl.join(gl.join(o[0], o[1]), gl.join(o[2], o[3])),
                    gl.join(gl.join(o[4], o[5]), gl.join(o[6], o[7])))  # [N, W, h, i % 2, i // 2]
    v = gl.permute(pairs, (0, 1, 4, 3, 2))  # [N, W, i // 2, i % 2, h]
    v = gl.reshape(v, (BLOCK_N, BLOCK_K // 32, 4, 4, 2))  # [N, group, c, i, h]: word 4 * group + c
    v = gl.permute(v, (0, 1, 3, 2, 4))  # [N, group, i, c, h]: k = 32 * group + 8 * i + 2 * c + h
    return gl.reshape(v, (BLOCK_N, BLOCK_K))


@gluon.jit(do_not_specialize=["num_slots"])
def mxfp4_moe_kernel(x_ptr, w_ptr, e_ptr, c_ptr, bias_ptr, weights_ptr, sorted_ptr, block_expert_ptr, padded_len_ptr,
                     table_ptr, N, K, num_slots, stride_xm, stride_we, stride_wn, stride_ee, stride_en2, stride_cm,
                     stride_biase,
                     A_ROW_DIV: gl.constexpr, HAS_BIAS: gl.constexpr, MUL_WEIGHT: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     GROUP_M: gl.constexpr, NO_WIDEN: gl.constexpr, num_warps: gl.constexpr):
    """fused_moe._grouped_gemm_kernel's MXFP4 product, transposed: acc [BLOCK_N, BLOCK_M] = widened weights
    [BLOCK_N, K] @ the block's activation rows^T, so that the weights are the MMA's register operand."""
    pid_m, pid_n = program_block(gl.program_id(0), gl.num_programs(0), N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(padded_len_ptr):
        return
    expert = gl.load(block_expert_ptr + pid_m).to(gl.int64)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    a_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    wl: gl.constexpr = word_layout(BLOCK_N, BLOCK_K, num_warps)
    xl: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [num_warps, 1], [1, 0])
    x_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.bfloat16)

    # activations: the block's slots' rows, BLOCK_K at a time through a ring of shared-memory stages
    xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, xl))
    xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, xl))
    x_slot = gl.load(sorted_ptr + pid_m * BLOCK_M + xm)
    x_rows = (x_slot // A_ROW_DIV).to(gl.int64)
    x_valid = x_slot < num_slots
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + xk[None, :]
    x_mask = x_valid[:, None] & (xk[None, :] >= 0)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], x_shared)

    # weights: BLOCK_K // 8 words a row a step, copied to shared memory (swizzled so that the word loads below
    # meet no bank conflict), then each thread loads the words its wgmma fragments take
    W: gl.constexpr = BLOCK_K // 8
    G: gl.constexpr = BLOCK_K // 32
    cl: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 4 // W, W // 4], [num_warps, 1], [1, 0])
    w_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=4, max_phase=W // 4, order=[1, 0])
    w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, W], w_shared)
    cn_ = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cl))
    cw_ = gl.arange(0, W, layout=gl.SliceLayout(0, cl))
    c_in = (cn_ < N)[:, None] & (cw_[None, :] >= 0)
    wc_ptrs = (w_ptr + expert * stride_we).to(gl.pointer_type(gl.int32)) + cn_[:, None].to(gl.int64) * (
        stride_wn // 4) + cw_[None, :]
    el3: gl.constexpr = exponent_layout(BLOCK_N, BLOCK_K, num_warps)
    el: gl.constexpr = gl.SliceLayout(2, el3)
    en = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, el))
    eg = gl.arange(0, G, layout=gl.SliceLayout(0, el))
    e_in = (en < N)[:, None] & (eg[None, :] >= 0)
    # stride_en2: the exponents' row stride in byte pairs, so that a row's two exponents of a step load as one
    e_ptrs = e_ptr + expert * stride_ee + en[:, None].to(gl.int64) * (stride_en2 * 2) + eg[None, :]
    table_lo = gl.load(table_ptr)
    table_hi = gl.load(table_ptr + 1)
    table_sign = gl.load(table_ptr + 2)

    k_steps = K // BLOCK_K
    for s in gl.static_range(STAGES - 1):
        async_copy.async_copy_global_to_shared(x_smem.index(s), x_ptrs + s * BLOCK_K,
                                               mask=x_mask & (s < k_steps))
        async_copy.async_copy_global_to_shared(w_smem.index(s), wc_ptrs + s * W, mask=c_in & (s < k_steps))
        async_copy.commit_group()
    e0 = gl.load(e_ptrs, mask=e_in, other=0)
    e1 = gl.load(e_ptrs + G, mask=e_in & (1 < k_steps), other=0)
    acc = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    a_prev = gl.zeros((BLOCK_N, BLOCK_K), gl.bfloat16, layout=a_dot)
    for k in range(k_steps):
        ahead_e = k + 2
        e2 = gl.load(e_ptrs + ahead_e * G, mask=e_in & (ahead_e < k_steps), other=0)
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        stage = k % STAGES
        ahead = k + STAGES - 1  # the weights' stage of step k - 1 was read (in registers) before the barrier
        async_copy.async_copy_global_to_shared(w_smem.index(ahead % STAGES), wc_ptrs + ahead * W,
                                               mask=c_in & (ahead < k_steps))
        words = w_smem.index(stage).load(wl)
        exponents = gl.expand_dims(e0, 2) + gl.zeros([BLOCK_N, G, 4], gl.uint8, layout=el3)  # a word's group's
        exponents = gl.convert_layout(gl.reshape(exponents, [BLOCK_N, W]).to(gl.int32), wl, assert_trivial=True)
        zero = gl.zeros_like(words)
        a = widen_words(words, exponents, table_lo + zero, table_hi + zero, table_sign + zero, BLOCK_N, BLOCK_K,
                        NO_WIDEN)
        a = gl.convert_layout(a, a_dot, assert_trivial=True)
        fence_async_shared()
        acc = warpgroup_mma(a, x_smem.index(stage).permute((1, 0)), acc, is_async=True)
        # step k - 1's MMA is done: its register operand may go, its activations' stage be refilled
        acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
        a_prev = a
        async_copy.async_copy_global_to_shared(x_smem.index(ahead % STAGES), x_ptrs + ahead * BLOCK_K,
                                               mask=x_mask & (ahead < k_steps))
        async_copy.commit_group()
        e0 = e1
        e1 = e2
    acc, a_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_prev))

    cn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    cm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
    c_slot = gl.load(sorted_ptr + pid_m * BLOCK_M + cm)
    c_valid = c_slot < num_slots
    if HAS_BIAS:
        acc += gl.load(bias_ptr + expert * stride_biase + cn, mask=cn < N, other=0.0).to(gl.float32)[:, None]
    if MUL_WEIGHT:
        acc = acc * gl.load(weights_ptr + c_slot, mask=c_valid, other=0.0).to(gl.float32)[None, :]
    c_ptrs = c_ptr + c_slot[None, :].to(gl.int64) * stride_cm + cn[:, None]
    gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_valid[None, :] & (cn[:, None] < N))


# the e2m1 -> bf16 table's words that byte permutes take from registers (low bytes, high bytes and signs: see
# WIDEN_ASM), loaded once per kernel so that they stay in registers rather than being rebuilt for every permute
TABLE_WORDS = (0xC0800000 - (1 << 32), 0x3F3F3F00, 0x8000)
NO_WIDEN = os.environ.get("MXFP4_GLUON_NO_WIDEN") == "1"
_tables: dict[torch.device, torch.Tensor] = {}


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, routing, a_row_div: int,
                 config: tuple[int, int, int, int, int], bias: torch.Tensor | None = None,
                 weights: torch.Tensor | None = None, a_scale: torch.Tensor | None = None,
                 w_scale: torch.Tensor | None = None, split_n: int | None = None,
                 kernel_layout: bool = False) -> torch.Tensor:
    """fused_moe.grouped_gemm's contract; the Gluon kernel for MXFP4 weights in the kernel layout with bf16
    activations on Hopper when K is whole K steps (and the exponents' rows an even number of bytes)."""
    bm, bn, bk, warps, stages = config
    mxfp4 = w.dtype == torch.uint8
    if not (mxfp4 and kernel_layout and a.dtype == torch.bfloat16 and a.is_cuda
            and torch.cuda.get_device_capability(a.device)[0] == 9 and (w.shape[2] * 2) % bk == 0
            and w_scale.stride(1) % 2 == 0 and bk % 32 == 0):
        return fused_moe.grouped_gemm(a, w, out, routing, a_row_div, config, bias, weights, a_scale, w_scale,
                                      split_n, kernel_layout)
    sorted_slots, block_experts, padded_len = routing
    n, k = w.shape[1], w.shape[2] * 2
    table = _tables.get(a.device)
    if table is None:
        table = _tables[a.device] = torch.tensor(TABLE_WORDS, dtype=torch.int32, device=a.device)
    grid = (block_experts.numel() * triton.cdiv(n, bn),)
    mxfp4_moe_kernel[grid](a, w, w_scale, out, bias if bias is not None else w,
                           weights if weights is not None else w, sorted_slots, block_experts, padded_len, table, n,
                           k, out.shape[0], a.stride(0), w.stride(0), w.stride(1), w_scale.stride(0),
                           w_scale.stride(1) // 2, out.stride(0), bias.stride(0) if bias is not None else 0,
                           A_ROW_DIV=a_row_div, HAS_BIAS=bias is not None, MUL_WEIGHT=weights is not None,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, GROUP_M=8, NO_WIDEN=NO_WIDEN,
                           num_warps=warps)
    return out
