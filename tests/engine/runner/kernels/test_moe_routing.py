"""The fused router kernel against layers/moe.py's torch definitions (Qwen's softmax in float32, top-k largest first,
renormalised or not; gpt-oss's top-k logits, then their softmax): on the GPU when there is one, else in Triton's CPU
interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels.moe_routing import route_softmax_topk as fused_route  # noqa: E402
from railyard.engine.runner.kernels.moe_routing import route_topk_softmax as fused_topk_softmax  # noqa: E402
from railyard.engine.runner.layers.moe import route_softmax_topk, route_topk_softmax  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("renormalize", [True, False], ids=["renormalised", "probabilities"])
@pytest.mark.parametrize(("tokens", "experts", "top_k", "dtype"), [
    (37, 128, 8, torch.float32), (5, 60, 4, torch.float32), (16, 32, 4, torch.bfloat16), (1, 8, 2, torch.float16)])
def test_the_fused_router_picks_torchs_experts_with_torchs_weights(tokens, experts, top_k, dtype, renormalize):
    logits = (torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens)) * 3).to(dtype)
    want_w, want_ids = route_softmax_topk(logits, top_k, renormalize)
    got_w, got_ids = fused_route(logits.to(DEVICE), top_k, renormalize)
    assert got_ids.dtype == torch.int64 and got_w.dtype == dtype
    assert torch.equal(got_ids.cpu(), want_ids)
    torch.testing.assert_close(got_w.cpu(), want_w, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-6)


def test_no_tokens_route_to_empty_outputs():
    w, ids = fused_route(torch.empty(0, 16, device=DEVICE), 2, True)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


@pytest.mark.parametrize(("tokens", "experts", "top_k", "dtype"), [
    (37, 128, 4, torch.float32), (19, 32, 4, torch.bfloat16), (3, 60, 8, torch.float16), (1, 8, 2, torch.bfloat16)])
def test_the_fused_gpt_oss_router_takes_the_top_logits_then_their_softmax(tokens, experts, top_k, dtype):
    logits = (torch.randn(tokens, experts, generator=torch.Generator().manual_seed(experts)) * 3).to(dtype)
    want_w, want_ids = route_topk_softmax(logits, top_k)
    got_w, got_ids = fused_topk_softmax(logits.to(DEVICE), top_k)
    assert got_ids.dtype == torch.int64 and got_w.dtype == dtype
    assert torch.equal(got_ids.cpu(), want_ids)
    torch.testing.assert_close(got_w.cpu(), want_w, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-6)
    torch.testing.assert_close(got_w.float().sum(dim=1).cpu(), torch.ones(tokens), rtol=1e-2, atol=1e-2)


def test_the_gpt_oss_router_takes_equal_logits_lowest_expert_first_and_any_logits_scale():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0, 0.0], [-300.0, -200.0, -500.0, -201.0, -900.0, -800.0]])
    weights, ids = fused_topk_softmax(logits.to(DEVICE), 3)
    assert ids.cpu().tolist() == [[1, 2, 4], [1, 3, 0]]
    want = torch.softmax(torch.tensor([[2.0, 2.0, 2.0], [-200.0, -201.0, -300.0]]), dim=-1)
    torch.testing.assert_close(weights.cpu(), want)


@pytest.mark.parametrize("order", ["softmax-first", "top-k-first"])
@pytest.mark.parametrize("experts", [8, 6])
def test_rows_of_nan_or_inf_scores_still_pick_k_distinct_real_experts(order, experts):
    # the graphs' warm-up runs on weights still loading (garbage): its ids index the experts' weights, so stay in range
    logits = torch.randn(4, experts)
    logits[0] = float("nan")
    logits[1, ::2] = float("nan")
    logits[2] = float("-inf")
    logits[3, 1] = float("inf")
    route = (lambda x: fused_route(x, 4, True)) if order == "softmax-first" else (lambda x: fused_topk_softmax(x, 4))
    _, ids = route(logits.to(DEVICE))
    for row in ids.cpu().tolist():
        assert len(set(row)) == 4 and all(0 <= i < experts for i in row)
    if order == "top-k-first":  # logits that are numbers are picked before NaNs (a softmax spreads a NaN over its row)
        real = list(range(1, experts, 2))
        assert set(ids[1, :len(real)].cpu().tolist()) == set(real)
        assert ids[3, 0].item() == 1
