"""Top-k routing in one Triton launch (vLLM's topk_softmax, written here anew), in the two orders the models use:
- route_softmax_topk (Qwen3-MoE): each token's router logits -> softmax in float32 -> its top_k experts, largest
  first -> their weights renormalised to sum 1 (Qwen's norm_topk_prob) or left as probabilities;
- route_topk_softmax (gpt-oss): the top_k logits, largest first -> a softmax over those k alone.
layers/moe.py holds both torch definitions (five launches, or torch.topk's two and a softmax); these are the same
functions on the GPU. Experts of equal score are taken lowest index first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # tokens per program


@triton.jit(do_not_specialize=["num_tokens"])
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, num_tokens, stride_t, NUM_EXPERTS: tl.constexpr,
                  E_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr,
                  SOFTMAX_FIRST: tl.constexpr, BLOCK_T: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, E_PAD)
    rows = t < num_tokens
    x = tl.load(logits_ptr + t.to(tl.int64)[:, None] * stride_t + e[None, :],
                mask=rows[:, None] & (e < NUM_EXPERTS)[None, :], other=float("-inf")).to(tl.float32)
    if SOFTMAX_FIRST:
        p = tl.exp(x - tl.max(x, 1)[:, None])
        x = p / tl.sum(p, 1)[:, None]
    # NaN scores (garbage rows, as the graphs' warm-up on weights still loading computes) count as -inf, and what is
    # still to pick is a mask of its own: every pick is then a real expert not picked before, whatever the scores
    # hold (rows past the end pick nothing and are never stored)
    work = tl.where(x == x, x, float("-inf"))
    left = (e < NUM_EXPERTS)[None, :] & rows[:, None]  # the experts still to pick from
    j = tl.arange(0, K_PAD)
    top_w = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_T, K_PAD), dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(tl.where(left, work, float("-inf")), 1)
        pick = tl.min(tl.where(left & (work == best[:, None]), e[None, :], E_PAD), 1)
        top_w = tl.where(j[None, :] == k, best[:, None], top_w)
        top_i = tl.where(j[None, :] == k, pick[:, None], top_i)
        left = left & (e[None, :] != pick[:, None])
    if not SOFTMAX_FIRST:  # top_w holds the k logits, the largest first
        top_w = tl.where((j < TOP_K)[None, :], top_w, float("-inf"))
        top_w = tl.exp(top_w - tl.max(top_w, 1)[:, None])
        top_w = top_w / tl.sum(top_w, 1)[:, None]
    elif RENORMALIZE:
        top_w = top_w / tl.sum(top_w, 1)[:, None]
    out = t.to(tl.int64)[:, None] * TOP_K + j[None, :]
    mask = rows[:, None] & (j < TOP_K)[None, :]
    tl.store(weights_ptr + out, top_w.to(weights_ptr.dtype.element_ty), mask=mask)
    tl.store(ids_ptr + out, top_i.to(tl.int64), mask=mask)


def route_softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64), as
    layers/moe.py's route_softmax_topk."""
    return _route(logits, top_k, renormalize, softmax_first=True)


def route_topk_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64), as
    layers/moe.py's route_topk_softmax."""
    return _route(logits, top_k, False, softmax_first=False)


def _route(logits: torch.Tensor, top_k: int, renormalize: bool,
           softmax_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_experts = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty((num_tokens, top_k), dtype=logits.dtype, device=logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
    if num_tokens:
        _route_kernel[(triton.cdiv(num_tokens, BLOCK_T),)](
            logits, weights, ids, num_tokens, logits.stride(0), NUM_EXPERTS=num_experts,
            E_PAD=triton.next_power_of_2(num_experts), TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
            RENORMALIZE=renormalize, SOFTMAX_FIRST=softmax_first, BLOCK_T=BLOCK_T, num_warps=4)
    return weights, ids
