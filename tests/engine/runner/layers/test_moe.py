"""The mixture-of-experts layer against HF transformers' Qwen3-MoE block on the same weights: routing (softmax,
top-k, renormalised), the experts' weighted sum, the per-expert checkpoint tensors stacked as they load, and
tensor-parallel shards whose partial sums add up to the whole layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from railyard.engine.runner.layers.activation import silu_and_mul_native
from railyard.engine.runner.layers.moe import FusedMoE, experts_reference, route_softmax_topk
from railyard.engine.runner.layers.parallel import ParallelState

E, K, H, I = 8, 2, 64, 32


def _hf_block(norm_topk_prob: bool = True, seed: int = 0):
    cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                                      norm_topk_prob=norm_topk_prob)
    block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    for param in block.parameters():
        param.data = torch.randn(param.shape, generator=gen) * 0.2
    return block


def _tokens(n: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed))


def _load_per_expert(moe: FusedMoE, block) -> None:
    """Copy HF's stacked experts in as a checkpoint holds them: one gate, up and down tensor per expert."""
    gate_up, down = block.experts.gate_up_proj.data, block.experts.down_proj.data
    for e in range(E):
        moe.expert_loader(moe.w13_weight, gate_up[e, :I], (e, "gate"))
        moe.expert_loader(moe.w13_weight, gate_up[e, I:], (e, "up"))
        moe.expert_loader(moe.w2_weight, down[e], (e, "down"))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_routing_is_hf_softmax_then_top_k_renormalised_when_asked(norm_topk_prob):
    block = _hf_block(norm_topk_prob)
    x = _tokens()
    _, hf_weights, hf_ids = block.gate(x)
    weights, ids = route_softmax_topk(F.linear(x, block.gate.weight), K, norm_topk_prob)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    if norm_topk_prob:
        torch.testing.assert_close(weights.sum(-1), torch.ones(len(x)))


def test_reference_experts_give_hfs_block_output():
    block = _hf_block()
    x = _tokens()
    _, weights, ids = block.gate(x)
    got = experts_reference(x, block.experts.gate_up_proj.data, block.experts.down_proj.data, weights, ids)
    torch.testing.assert_close(got, block(x[None])[0], rtol=1e-5, atol=1e-6)


def test_per_expert_checkpoint_tensors_stack_into_the_experts_and_give_hfs_output():
    block = _hf_block()
    moe = FusedMoE(E, H, I)
    _load_per_expert(moe, block)
    assert torch.equal(moe.w13_weight, block.experts.gate_up_proj.data)
    assert torch.equal(moe.w2_weight, block.experts.down_proj.data)
    x = _tokens()
    _, weights, ids = block.gate(x)
    torch.testing.assert_close(moe(x, weights, ids), block(x[None])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_hold_slices_of_every_expert_and_their_partial_sums_add_up(tp):
    block = _hf_block()
    x = _tokens()
    _, weights, ids = block.gate(x)
    total = torch.zeros(len(x), H)
    for rank in range(tp):
        shard = FusedMoE(E, H, I, ParallelState(rank, tp))
        _load_per_expert(shard, block)
        n = I // tp
        assert torch.equal(shard.w2_weight, block.experts.down_proj.data[:, :, rank * n:(rank + 1) * n])
        total += shard(x, weights, ids, reduce=False)
    torch.testing.assert_close(total, block(x[None])[0], rtol=1e-5, atol=1e-6)


def _token_by_token(x, w13, w2, weights, ids, activation=silu_and_mul_native, b13=None, b2=None):
    """The definition, one token and one of its experts at a time."""
    out = torch.zeros_like(x)
    for t in range(len(x)):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = F.linear(x[t], w13[e], None if b13 is None else b13[e])
            out[t] += weights[t, j] * F.linear(activation(h), w2[e], None if b2 is None else b2[e])
    return out


def _random_experts(seed: int, tokens: int = 6):
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = torch.randn(E, 2 * I, H, generator=gen) * 0.2, torch.randn(E, H, I, generator=gen) * 0.2
    weights, ids = route_softmax_topk(torch.randn(tokens, E, generator=gen), K, True)
    return _tokens(tokens, seed), w13, w2, weights, ids, gen


def test_expert_biases_are_added_before_the_routing_weight():
    x, w13, w2, weights, ids, gen = _random_experts(3)
    b13, b2 = torch.randn(E, 2 * I, generator=gen), torch.randn(E, H, generator=gen)
    got = experts_reference(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2)
    torch.testing.assert_close(got, _token_by_token(x, w13, w2, weights, ids, b13=b13, b2=b2), rtol=1e-5, atol=1e-5)


def test_the_activation_between_the_projections_is_pluggable():
    x, w13, w2, weights, ids, _ = _random_experts(4)
    tanh_and_mul = lambda h: torch.tanh(h[..., :I]) * h[..., I:]  # noqa: E731
    got = experts_reference(x, w13, w2, weights, ids, activation=tanh_and_mul)
    torch.testing.assert_close(got, _token_by_token(x, w13, w2, weights, ids, tanh_and_mul), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, experts_reference(x, w13, w2, weights, ids), atol=1e-3)
