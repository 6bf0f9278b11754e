"""Tokens grouped by expert for the fused-MoE GEMMs, in three small Triton launches (vLLM's moe_align_block_size,
written here anew).

The T * k (token, expert) slots are listed by ascending expert, each expert's run in slot order and padded to a
multiple of block_m with the sentinel slot T * k, so every block_m rows of the list belong to one expert. The slots
are cut into chunks of CHUNK:
1. _count_kernel (one program a chunk): how many of the chunk's slots go to each expert -> counts [E, chunks];
2. _prefix_kernel (one program an expert): the running count over chunks, so a chunk knows how many of an
   expert's slots come before its own -> before [E, chunks], and the expert's total;
3. _place_kernel (one program a chunk of slots and a tile of the list): each expert's padded start from the
   totals; a slot goes to start[e] + before[e, chunk] + its rank among its chunk's slots of e; the padding rows
   get the sentinel and each block its expert.
A small decode step's slots (up to ONE_PROGRAM_SLOTS) take one launch instead, _one_program_kernel: one block
sorts the slots by (expert, slot) in registers (tl.sort), counts each expert's slots (tl.histogram) and places
them, so its three launches' fixed costs are paid once per layer.
Shapes and launches depend on T only, never on the routing, and nothing waits for the host: one CUDA graph per
token count replays any routing. (Plain torch took ~15 launches, and its scan over the [slots, E] one-hot matrix
runs one thread per expert down all the slots.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 128  # slots per program: the rank within a chunk compares every pair of its slots
# At most this many slots are placed by one block. Its sort grows as slots x log^2(slots) on one SM while the three
# launches' cost stays flat, so past a bound the three launches win (BENCHMARKS.md has where they cross, timed by
# scripts/dev/moe_align_ab.py).
ONE_PROGRAM_SLOTS = 512
ONE_PROGRAM_MIN_PAD = 256  # the sorted width's floor: token counts below share one compiled kernel


@triton.jit
def _padded_runs(counts, BLOCK_M: tl.constexpr):
    """Each expert's slot count -> its run in the list, padded to whole row blocks, and where each run ends."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    return padded, tl.cumsum(padded, 0)


@triton.jit
def _run_at(ends, rows):
    """The run (expert) each of the list's `rows` falls in, from the runs' ends: the number of experts past the
    end."""
    return tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), 1)


@triton.jit(do_not_specialize=["num_slots", "num_chunks"])
def _count_kernel(ids_ptr, counts_ptr, num_slots, num_chunks, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr,
                  CHUNK: tl.constexpr):
    c = tl.program_id(0)
    s = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + s, mask=s < num_slots, other=0).to(tl.int32)
    e = tl.arange(0, E_PAD)
    hits = tl.sum(((ids[:, None] == e[None, :]) & (s < num_slots)[:, None]).to(tl.int32), 0)
    tl.store(counts_ptr + e * num_chunks + c, hits, mask=e < NUM_EXPERTS)


@triton.jit(do_not_specialize=["num_chunks"])
def _prefix_kernel(counts_ptr, before_ptr, totals_ptr, num_chunks, BLOCK_C: tl.constexpr):
    e = tl.program_id(0)
    row = e.to(tl.int64) * num_chunks
    carry = tl.zeros((), dtype=tl.int32)
    for j in range(0, tl.cdiv(num_chunks, BLOCK_C)):
        c = j * BLOCK_C + tl.arange(0, BLOCK_C)
        n = tl.load(counts_ptr + row + c, mask=c < num_chunks, other=0)
        tl.store(before_ptr + row + c, carry + tl.cumsum(n, 0) - n, mask=c < num_chunks)
        carry += tl.sum(n, 0)
    tl.store(totals_ptr + e, carry)


@triton.jit(do_not_specialize=["num_slots", "num_chunks", "size"])
def _place_kernel(ids_ptr, before_ptr, totals_ptr, sorted_ptr, block_experts_ptr, padded_len_ptr, num_slots,
                  num_chunks, size, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                  CHUNK: tl.constexpr):
    i = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    totals = tl.load(totals_ptr + e, mask=e < NUM_EXPERTS, other=0)
    padded, ends = _padded_runs(totals, BLOCK_M)
    if i == 0:
        tl.store(padded_len_ptr, tl.sum(padded, 0))
    # this chunk's slots to their rows
    if i < num_chunks:
        r = tl.arange(0, CHUNK)
        s = i * CHUNK + r
        real = s < num_slots
        ids = tl.load(ids_ptr + s, mask=real, other=0).to(tl.int32)
        rank = tl.sum(((ids[:, None] == ids[None, :]) & (r[None, :] < r[:, None])).to(tl.int32), 1)
        run_start = tl.sum(tl.where(e[None, :] < ids[:, None], padded[None, :], 0), 1)  # the runs before its own
        row = run_start + tl.load(before_ptr + ids.to(tl.int64) * num_chunks + i, mask=real, other=0) + rank
        tl.store(sorted_ptr + row, s.to(tl.int32), mask=real)
    # this tile of the list: sentinels in the padding rows (and past the end), each block's expert
    p = i * CHUNK + tl.arange(0, CHUNK)
    expert = _run_at(ends, p)
    in_run = expert < NUM_EXPERTS
    expert_c = tl.minimum(expert, NUM_EXPERTS - 1)
    run_start = tl.sum(tl.where(e[None, :] < expert_c[:, None], padded[None, :], 0), 1)
    run_total = tl.load(totals_ptr + expert_c)
    pad_row = (p < size) & (~in_run | (p - run_start >= run_total))
    tl.store(sorted_ptr + p, tl.full((CHUNK,), 0, tl.int32) + num_slots, mask=pad_row)
    first = (p % BLOCK_M == 0) & (p < size)
    tl.store(block_experts_ptr + p // BLOCK_M, expert_c, mask=first)


@triton.jit(do_not_specialize=["num_slots", "size"])
def _one_program_kernel(ids_ptr, sorted_ptr, block_experts_ptr, padded_len_ptr, num_slots, size,
                        NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                        SLOTS_PAD: tl.constexpr, BLOCK_P: tl.constexpr):
    s = tl.arange(0, SLOTS_PAD)
    real = s < num_slots
    ids = tl.load(ids_ptr + s, mask=real, other=0).to(tl.int32)
    counts = tl.histogram(ids, E_PAD, mask=real)
    padded, ends = _padded_runs(counts, BLOCK_M)
    tl.store(padded_len_ptr, tl.sum(padded, 0))
    # every row of the list a sentinel first, then the slots over them (the barrier orders the two for the block)
    for p0 in range(0, size, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        tl.store(sorted_ptr + p, tl.full((BLOCK_P,), 0, tl.int32) + num_slots, mask=p < size)
    tl.debug_barrier()
    # sorted by (expert, slot): the i-th slot of the order sits i - (slots of earlier experts) into its expert's run
    order = tl.sort(tl.where(real, ids, E_PAD) * SLOTS_PAD + s)
    expert = tl.minimum(order // SLOTS_PAD, E_PAD - 1)
    shift = tl.gather(ends - padded - (tl.cumsum(counts, 0) - counts), expert, 0)
    tl.store(sorted_ptr + s + shift, order % SLOTS_PAD, mask=real)
    # each block's expert: the run it falls in (the last expert's past the end)
    for b0 in range(0, size // BLOCK_M, BLOCK_P):
        b = b0 + tl.arange(0, BLOCK_P)
        tl.store(block_experts_ptr + b, tl.minimum(_run_at(ends, b * BLOCK_M), NUM_EXPERTS - 1),
                 mask=b < size // BLOCK_M)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """topk_ids [T, k] -> (sorted_slots [P] int32, block_experts [P / block_m] int32, padded_len [1] int32).

    sorted_slots lists the slots t * k + j grouped by expert, ascending expert, each expert's run in slot order and
    padded to a multiple of block_m with the sentinel T * k; block_experts[b] is the expert of rows b * block_m..
    (the last expert for blocks past padded_len); padded_len the rows in use. P = T * k + min(E, T * k) *
    (block_m - 1), rounded up to block_m: a bound that depends on T only (the module docstring says how)."""
    slots = topk_ids.numel()
    device = topk_ids.device
    ids = topk_ids.reshape(-1)
    size = -(-(slots + min(num_experts, slots) * (block_m - 1)) // block_m) * block_m
    e_pad = triton.next_power_of_2(num_experts)
    sorted_slots = torch.empty(size, dtype=torch.int32, device=device)
    block_experts = torch.empty(size // block_m, dtype=torch.int32, device=device)
    padded_len = torch.empty(1, dtype=torch.int32, device=device)
    if slots <= ONE_PROGRAM_SLOTS:
        _one_program_kernel[(1,)](ids, sorted_slots, block_experts, padded_len, slots, size, NUM_EXPERTS=num_experts,
                                  E_PAD=e_pad, BLOCK_M=block_m,
                                  SLOTS_PAD=max(ONE_PROGRAM_MIN_PAD, triton.next_power_of_2(slots)), BLOCK_P=128,
                                  num_warps=8)
        return sorted_slots, block_experts, padded_len
    chunks = triton.cdiv(slots, CHUNK)
    counts = torch.empty((num_experts, chunks), dtype=torch.int32, device=device)
    before = torch.empty_like(counts)
    totals = torch.empty(num_experts, dtype=torch.int32, device=device)
    _count_kernel[(chunks,)](ids, counts, slots, chunks, NUM_EXPERTS=num_experts, E_PAD=e_pad, CHUNK=CHUNK, num_warps=4)
    _prefix_kernel[(num_experts,)](counts, before, totals, chunks, BLOCK_C=1024, num_warps=4)
    _place_kernel[(triton.cdiv(size, CHUNK),)](
        ids, before, totals, sorted_slots, block_experts, padded_len, slots, chunks, size,
        NUM_EXPERTS=num_experts, E_PAD=e_pad, BLOCK_M=block_m, CHUNK=CHUNK, num_warps=4)
    return sorted_slots, block_experts, padded_len
