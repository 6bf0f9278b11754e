"""The fused-MoE Triton path against the layer's torch reference (layers/moe.py): the expert-sorted, block-padded
slot list, both grouped GEMMs with biases and the routing weights in the epilogue, FP8 experts with block scales,
and fixed shapes for a token count whatever the routing (what lets it run inside CUDA graphs). On the GPU when
there is one, else in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import fused_moe  # noqa: E402
from railyard.engine.runner.kernels.fused_moe import align_by_expert, fused_experts  # noqa: E402
from railyard.engine.runner.layers.activation import silu_and_mul_native  # noqa: E402
from railyard.engine.runner.layers.fp8_block import quantize_blocks  # noqa: E402
from railyard.engine.runner.layers.moe import (experts_reference, experts_reference_fp8,  # noqa: E402
                                               quantize_experts, route_softmax_topk)
from railyard.engine.runner.layers.fp8 import FP8  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA = DEVICE == "cuda"


def _routing(tokens: int, experts: int, top_k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return route_softmax_topk(torch.randn(tokens, experts, generator=gen) * 2, top_k, True)


def _align_by_hand(ids: torch.Tensor, experts: int, block: int) -> list[int]:
    """The definition: each expert's slots in order, padded with the sentinel to a multiple of block."""
    flat, out = ids.reshape(-1).tolist(), []
    for e in range(experts):
        run = [s for s, x in enumerate(flat) if x == e]
        out += run + [len(flat)] * (-len(run) % block)
    return out


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block"), [(1, 8, 2, 16), (37, 8, 2, 16), (70, 16, 4, 64),
                                                                      (5, 128, 8, 16)])
def test_slots_are_grouped_by_expert_and_each_run_padded_to_whole_blocks(tokens, experts, top_k, block):
    _, ids = _routing(tokens, experts, top_k, seed=tokens)
    sorted_slots, block_experts, padded_len = align_by_expert(ids.to(DEVICE), experts, block)
    want = _align_by_hand(ids, experts, block)
    assert padded_len.item() == len(want)
    assert sorted_slots[:len(want)].tolist() == want
    assert (sorted_slots[len(want):] == tokens * top_k).all()  # the rest: sentinels
    flat = ids.reshape(-1)
    for b in range(len(want) // block):
        real = [s for s in want[b * block:(b + 1) * block] if s < len(flat)]
        assert real and all(flat[s] == block_experts[b].item() for s in real)


def test_the_slot_lists_shapes_depend_on_the_token_count_only():
    """Two routings of the same 24 tokens, one spread over all experts and one onto a single expert, give tensors of
    the same shapes: a CUDA graph captured with one replays the other."""
    spread = torch.arange(48).reshape(24, 2) % 16
    same = torch.zeros(24, 2, dtype=torch.int64)
    same[:, 1] = 1
    a, b = align_by_expert(spread.to(DEVICE), 16, 16), align_by_expert(same.to(DEVICE), 16, 16)
    assert [t.shape for t in a] == [t.shape for t in b]
    assert a[2].item() == 16 * 16 and b[2].item() == 2 * 32  # 48 slots: 16 experts x 3 -> 16 rows each; 2 x 24 -> 32


def _experts(experts: int, hidden: int, inter: int, seed: int, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.1
    b13 = torch.randn(experts, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) if bias else None
    return w13, w2, b13, b2


def _on(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("config", [fused_moe.SMALL, fused_moe.LARGE], ids=["small-tiles", "large-tiles"])
@pytest.mark.parametrize("tokens", [1, 3, 70])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "expert-biases"])
def test_fused_experts_give_the_reference_experts_output(config, tokens, bias):
    w13, w2, b13, b2 = _experts(8, 64, 32, seed=tokens, bias=bias)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(1))
    weights, ids = _routing(tokens, 8, 2, seed=tokens + 1)
    want = experts_reference(x, w13, w2, weights, ids, silu_and_mul_native, b13, b2)
    got = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, *_on(DEVICE, b13, b2),
                        config=config)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_fused_experts_with_a_gate_up_wider_than_one_tile_and_top_8_of_32():
    w13, w2, _, _ = _experts(32, 96, 80, seed=5)  # gate/up 160 rows: two 128-wide column blocks
    x = torch.randn(21, 96, generator=torch.Generator().manual_seed(2))
    weights, ids = _routing(21, 32, 8, seed=6)
    want = experts_reference(x, w13, w2, weights, ids)
    got = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, config=fused_moe.LARGE)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("hidden", "inter"), [(256, 160), (64, 32)], ids=["two-k-blocks-split-halves", "tiny"])
@pytest.mark.parametrize("tokens", [2, 40])
def test_fp8_fused_experts_give_the_block_scaled_reference(hidden, inter, tokens):
    """The same e4m3 numbers both ways (weights by 128 x 128 blocks, activations by token and 128-wide group); the
    kernel scales each K step's partial sum where the reference dequantizes first: float32 rounding apart."""
    w13, w2, _, _ = _experts(8, hidden, inter, seed=7)
    q13, q2 = torch.empty(w13.shape, dtype=FP8), torch.empty(w2.shape, dtype=FP8)
    s13 = torch.empty(8, 2 * -(-inter // 128), -(-hidden // 128))
    s2 = torch.empty(8, -(-hidden // 128), -(-inter // 128))
    quantize_experts(w13, q13, s13)
    quantize_experts(w2, q2, s2)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3))
    weights, ids = _routing(tokens, 8, 2, seed=8)
    want = experts_reference_fp8(x, q13, s13, q2, s2, weights, ids)
    got = fused_experts(*_on(DEVICE, x, q13, q2, weights, ids), silu_and_mul_native, None, None,
                        *_on(DEVICE, s13, s2), config=fused_moe.FP8_LARGE)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    # and those numbers are the unquantized experts' to e4m3's precision
    full = experts_reference(x, w13, w2, weights, ids)
    assert ((got.cpu() - full).norm() / full.norm()).item() < 0.1


def test_the_split_halves_scales_are_the_gate_and_up_projections_own():
    w13, _, _, _ = _experts(1, 64, 32, seed=9)
    q, s = torch.empty(w13.shape, dtype=FP8), torch.empty(1, 2, 1)
    quantize_experts(w13, q, s)
    for half in range(2):
        hq, hs = quantize_blocks(w13[0, half * 32:(half + 1) * 32])
        assert torch.equal(q[0, half * 32:(half + 1) * 32].view(torch.uint8), hq.view(torch.uint8))
        assert torch.equal(s[0, half], hs[0])


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_a_captured_graph_replays_new_routing_on_gpu():
    w13, w2, _, _ = _on("cuda", *_experts(16, 128, 64, seed=10))
    x = torch.randn(32, 128, device="cuda")
    weights, ids = _on("cuda", *_routing(32, 16, 4, seed=11))
    fused_experts(x, w13, w2, weights, ids, silu_and_mul_native)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, w13, w2, weights, ids, silu_and_mul_native)
    new_weights, new_ids = _on("cuda", *_routing(32, 16, 4, seed=12))
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)
