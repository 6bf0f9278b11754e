"""Batched LoRA kernels (Punica's segmented gather matmuls, as vLLM's lora_shrink / lora_expand): each program
takes one row tile of one adapter slot's tokens (LoRABatch's order, counts and starts, on the device) and one
output tile (expand: a run of them).

The grid is fixed by the step's token count and the number of slots, never by how tokens spread over adapters: the
slots' row tiles, laid end to end, number at most cdiv(T, BLOCK_M) + slots, and a program finds its slot and tile by
walking the slots' counts; programs past the last tile return at once. So a CUDA graph captured for a token count
replays for any mix of adapters and base-model tokens (whose group, after the last slot, no program visits), and a
long prefill launches no idle programs per slot.

shrink: out[t, :] = x[t] A_s^T in float32 (split over K with atomic adds, into the batch's zeroed workspace, when few
tokens would leave the GPU idle).
expand: y[t, part columns] += out[t, part's rank block] (rounded to B's dtype) B_s^T, in y's dtype; every output
element belongs to exactly one program, so no atomics.
expand_silu_and_mul: a gate/up projection's expand and the SiLU-and-mul after it in one pass, its row tiles over the
base-model group too (those rows take the plain activation): y is read once and not written back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from railyard.engine.runner.kernels.fused import silu_mul_values
from railyard.engine.runner.layers.lora import SPLIT_K_MAX_TOKENS


@triton.jit
def _row_tile(counts_ptr, starts_ptr, order_ptr, NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's (slot, token indices, row mask): its place among the slots' row tiles laid end to end
    (slot -1: past the last tile)."""
    pid = tl.program_id(0)
    slot = -1
    tile = 0
    first = 0  # the first tile of slot s
    for s in tl.static_range(NUM_SLOTS):
        tiles = tl.cdiv(tl.load(counts_ptr + s), BLOCK_M)
        hit = (pid >= first) & (pid < first + tiles)
        slot = tl.where(hit, s, slot)
        tile = tl.where(hit, pid - first, tile)
        first += tiles
    count = tl.load(counts_ptr + tl.maximum(slot, 0))
    start = tl.load(starts_ptr + tl.maximum(slot, 0))
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = (offs_m < count) & (slot >= 0)
    tok = tl.load(order_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
    return slot, tok, mask_m


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, out_ptr, order_ptr, counts_ptr, starts_ptr, N, K,
                   stride_xm, stride_xk, stride_as, stride_an, stride_ak, stride_om, stride_on,
                   NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    slot, tok, mask_m = _row_tile(counts_ptr, starts_ptr, order_ptr, NUM_SLOTS, BLOCK_M)
    if slot < 0:
        return
    pid_n = tl.program_id(1) // SPLIT_K
    pid_k = tl.program_id(1) % SPLIT_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        xt = tl.load(x_ptr + tok[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                     mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        at = tl.load(a_base + offs_n[None, :] * stride_an + offs_k[:, None] * stride_ak,
                     mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(xt, at, input_precision=DOT_PRECISION)
    ptrs = out_ptr + tok[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(ptrs, acc, mask=mask)
    else:
        tl.atomic_add(ptrs, acc, mask=mask)


@triton.jit
def _expand_kernel(s_ptr, b_ptr, y_ptr, order_ptr, counts_ptr, starts_ptr, offsets_ptr,
                   stride_sm, stride_sn, stride_bs, stride_bn, stride_br, stride_ym, stride_yn,
                   NUM_SLOTS: tl.constexpr, TILES_PER_PART: tl.constexpr, N_ITER: tl.constexpr, RANK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PARTS_ALIGNED: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """One row tile of one slot's tokens times N_ITER consecutive BLOCK_N column tiles of one part: the program
    finds its tokens and loads their shrunk rows once, then streams the part's B and y tiles. PARTS_ALIGNED: every
    part starts and ends on a multiple of 8 columns, which Triton cannot see in offsets it loads; told, it moves y
    and B in 16-byte vectors instead of one element per instruction."""
    chunks: tl.constexpr = (TILES_PER_PART + N_ITER - 1) // N_ITER
    part = tl.program_id(1) // chunks
    first_tile = (tl.program_id(1) % chunks) * N_ITER
    lo = tl.load(offsets_ptr + part)
    hi = tl.load(offsets_ptr + part + 1)
    if PARTS_ALIGNED:
        lo = tl.multiple_of(lo, 8)
        hi = tl.multiple_of(hi, 8)
    if lo + first_tile * BLOCK_N >= hi:
        return
    slot, tok, mask_m = _row_tile(counts_ptr, starts_ptr, order_ptr, NUM_SLOTS, BLOCK_M)
    if slot < 0:
        return
    offs_r = tl.arange(0, RANK)
    st = tl.load(s_ptr + tok[:, None] * stride_sm + (part * RANK + offs_r)[None, :] * stride_sn,
                 mask=mask_m[:, None], other=0.0).to(b_ptr.dtype.element_ty)
    b_base = b_ptr + slot.to(tl.int64) * stride_bs
    for i in range(N_ITER):
        offs_n = lo + (first_tile + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        bt = tl.load(b_base + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br, mask=mask_n[None, :],
                     other=0.0)
        acc = tl.dot(st, bt, input_precision=DOT_PRECISION)
        ptrs = y_ptr + tok[:, None] * stride_ym + offs_n[None, :] * stride_yn
        mask = mask_m[:, None] & mask_n[None, :]
        y = tl.load(ptrs, mask=mask, other=0.0)
        tl.store(ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


@triton.jit
def _expand_silu_and_mul_kernel(s_ptr, b_ptr, y_ptr, out_ptr, order_ptr, counts_ptr, starts_ptr, I,
                                stride_sm, stride_sn, stride_bs, stride_bn, stride_br, stride_ym, stride_yn,
                                stride_om, stride_on, NUM_SLOTS: tl.constexpr, N_ITER: tl.constexpr,
                                RANK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                DOT_PRECISION: tl.constexpr):
    """out[t, j] = silu(gate) * up of a gate/up projection's row t, each of gate and up with token t's adapter part
    added first (rounded to y's dtype, as expand's in-place add rounds it). The row tiles span the base-model group
    too (after the last slot), whose rows take y as it is: every row of out is written once, y is only read."""
    slot, tok, mask_m = _row_tile(counts_ptr, starts_ptr, order_ptr, NUM_SLOTS + 1, BLOCK_M)
    if slot < 0:
        return
    lora_rows = slot < NUM_SLOTS
    adapted = mask_m & lora_rows  # the base group's rows add exact zeros
    offs_r = tl.arange(0, RANK)
    s_rows = s_ptr + tok[:, None] * stride_sm + offs_r[None, :] * stride_sn
    s_gate = tl.load(s_rows, mask=adapted[:, None], other=0.0).to(b_ptr.dtype.element_ty)
    s_up = tl.load(s_rows + RANK * stride_sn, mask=adapted[:, None], other=0.0).to(b_ptr.dtype.element_ty)
    b_base = b_ptr + tl.minimum(slot, NUM_SLOTS - 1).to(tl.int64) * stride_bs
    for i in range(N_ITER):
        offs_n = (tl.program_id(1) * N_ITER + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < I
        mask = mask_m[:, None] & mask_n[None, :]
        b_mask = mask_n[None, :] & lora_rows
        b_gate = tl.load(b_base + offs_n[None, :] * stride_bn + offs_r[:, None] * stride_br, mask=b_mask, other=0.0)
        b_up = tl.load(b_base + (I + offs_n)[None, :] * stride_bn + offs_r[:, None] * stride_br, mask=b_mask,
                       other=0.0)
        y_rows = y_ptr + tok[:, None] * stride_ym
        g = tl.load(y_rows + offs_n[None, :] * stride_yn, mask=mask, other=0.0)
        u = tl.load(y_rows + (I + offs_n)[None, :] * stride_yn, mask=mask, other=0.0)
        g = (g.to(tl.float32) + tl.dot(s_gate, b_gate, input_precision=DOT_PRECISION)).to(g.dtype)
        u = (u.to(tl.float32) + tl.dot(s_up, b_up, input_precision=DOT_PRECISION)).to(u.dtype)
        tl.store(out_ptr + tok[:, None] * stride_om + offs_n[None, :] * stride_on,
                 silu_mul_values(g, u).to(out_ptr.dtype.element_ty), mask=mask)


def _dot_precision(t: torch.Tensor) -> str:
    """float32 models multiply in full float32 (as the torch reference and HF do), not TF32."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _tiles_per_program(tiles: int, num_tokens: int) -> int:
    """Column tiles one expand program streams (of a part's `tiles`): its fixed cost (finding its slot and tokens,
    loading their shrunk rows) is spread over them; decode steps have few row tiles, so more tiles each."""
    return min(tiles, 8 if num_tokens <= SPLIT_K_MAX_TOKENS else 4)


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 16 else 32 if num_tokens <= 256 else 64


def shrink(x: torch.Tensor, a: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] and A [slots, N, K] -> float32 [T, N], in `out` where given (zeroed: a split-K step adds into it);
    rows of base-model tokens are left as they are (expand never reads them)."""
    t, k = x.shape
    slots, n, _ = a.shape
    # One column tile covers a fused projection's whole rank block where it can (qkv's 3 x 16 = 48 columns), so
    # x, the shrink's only large operand, is read once.
    block_m, block_n, block_k = _block_m(t), max(16, min(64, triton.next_power_of_2(n))), 64
    # Few row tiles per slot leave most of the GPU idle over a long K: split K across programs instead.
    split_k = 1 if t > SPLIT_K_MAX_TOKENS else max(1, min(16, triton.cdiv(k, 4 * block_k)))
    if out is None:
        out = (torch.zeros if split_k > 1 else torch.empty)((t, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(t, block_m) + slots, triton.cdiv(n, block_n) * split_k)
    _shrink_kernel[grid](x, a, out, order, counts, starts, n, k, x.stride(0), x.stride(1), a.stride(0), a.stride(1),
                         a.stride(2), out.stride(0), out.stride(1), NUM_SLOTS=slots, BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_K=block_k, SPLIT_K=split_k, DOT_PRECISION=_dot_precision(x))
    return out


def expand(shrunk: torch.Tensor, b: torch.Tensor, y: torch.Tensor, order: torch.Tensor, counts: torch.Tensor,
           starts: torch.Tensor, part_offsets: torch.Tensor, max_part: int, rank: int,
           parts_aligned: bool = False) -> None:
    """y [T, out] += shrunk's part blocks times each part's B [slots, out, rank] columns, in place. parts_aligned:
    every part offset is a multiple of 8 (then y's and B's rows must start 16-byte aligned too, as torch's do)."""
    t = y.shape[0]
    block_m = _block_m(t)
    block_n = 64 if max_part >= 64 else 32 if max_part >= 32 else 16
    tiles = triton.cdiv(max_part, block_n)
    n_iter = _tiles_per_program(tiles, t)
    slots = b.shape[0]
    grid = (triton.cdiv(t, block_m) + slots, triton.cdiv(tiles, n_iter) * (part_offsets.numel() - 1))
    _expand_kernel[grid](shrunk, b, y, order, counts, starts, part_offsets, shrunk.stride(0), shrunk.stride(1),
                         b.stride(0), b.stride(1), b.stride(2), y.stride(0), y.stride(1), NUM_SLOTS=slots,
                         TILES_PER_PART=tiles, N_ITER=n_iter, RANK=rank, BLOCK_M=block_m, BLOCK_N=block_n,
                         PARTS_ALIGNED=parts_aligned, DOT_PRECISION=_dot_precision(b))


def expand_silu_and_mul(shrunk: torch.Tensor, b: torch.Tensor, y: torch.Tensor, order: torch.Tensor,
                        counts: torch.Tensor, starts: torch.Tensor, rank: int) -> torch.Tensor:
    """silu(gate) * up [T, I] of a gate/up projection's base output y [T, 2I], each token's adapter parts (shrunk's
    two rank blocks times B [slots, 2I, rank]) added first: expand and silu_and_mul in one pass, y read once and
    never written (the activation's input is a gate/up projection's output only)."""
    t, inter = y.shape[0], y.shape[1] // 2
    out = torch.empty((t, inter), dtype=y.dtype, device=y.device)
    if t == 0:
        return out
    block_m, block_n = _block_m(t), 64
    n_iter = _tiles_per_program(triton.cdiv(inter, block_n), t)
    slots = b.shape[0]
    grid = (triton.cdiv(t, block_m) + slots + 1, triton.cdiv(inter, block_n * n_iter))
    _expand_silu_and_mul_kernel[grid](shrunk, b, y, out, order, counts, starts, inter, shrunk.stride(0),
                                      shrunk.stride(1), b.stride(0), b.stride(1), b.stride(2), y.stride(0),
                                      y.stride(1), out.stride(0), out.stride(1), NUM_SLOTS=slots, N_ITER=n_iter,
                                      RANK=rank, BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=_dot_precision(b))
    return out
