"""The fused router kernel against layers/moe.py's torch definition (softmax in float32, top-k largest first,
renormalised or not): on the GPU when there is one, else in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels.moe_routing import route_softmax_topk as fused_route  # noqa: E402
from railyard.engine.runner.layers.moe import route_softmax_topk  # noqa: E402

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
