"""The mixture-of-experts layer against HF transformers' Qwen3-MoE block on the same weights: routing (softmax,
top-k, renormalised), the experts' weighted sum, the per-expert checkpoint tensors stacked as they load, and
tensor-parallel shards whose partial sums add up to the whole layer (MXFP4's in whole 32-weight groups, padded)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
import transformers

from railyard.engine.runner.layers.activation import silu_and_mul_native
from railyard.engine.runner.layers.moe import (FusedMoE, experts_reference, on_device, route_softmax_topk,
                                              route_topk_softmax)
from railyard.engine.runner.layers.mxfp4 import quantize_mxfp4, to_kernel_layout
from railyard.engine.runner.layers.parallel import ParallelState
from railyard.engine.runner.layers.activation import clamped_swiglu

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


@pytest.mark.parametrize("route", [route_softmax_topk, route_topk_softmax])
def test_each_router_runs_as_its_torch_definition_off_the_gpu_and_as_the_fused_kernel_on_it(route):
    assert on_device(route, torch.zeros(2, E)) is route
    if torch.cuda.is_available():
        from railyard.engine.runner.kernels import moe_routing
        assert on_device(route, torch.zeros(2, E, device="cuda")) is getattr(moe_routing, route.__name__)


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


def _mxfp4_checkpoint(inter: int, seed: int):
    """One gpt-oss-like MoE layer's experts as an MXFP4 checkpoint holds them, per expert: gate, up and down blocks
    (bytes, [out, in / 2]) and exponents ([out, in / 32]), and biases."""
    gen = torch.Generator().manual_seed(seed)
    gate_up, down = torch.randn(E, 2 * inter, H, generator=gen) * 0.2, torch.randn(E, H, inter, generator=gen) * 0.2
    (b13, s13), (b2, s2) = quantize_mxfp4(gate_up), quantize_mxfp4(down)
    b13, b2 = b13.reshape(E, 2 * inter, H // 2), b2.reshape(E, H, inter // 2)
    return dict(w13_weight=b13, w13_weight_scale=s13, w2_weight=b2, w2_weight_scale=s2,
                w13_bias=torch.randn(E, 2 * inter, generator=gen), w2_bias=torch.randn(E, H, generator=gen))


def _load_mxfp4(moe: FusedMoE, ckpt: dict[str, torch.Tensor]) -> None:
    inter = ckpt["w13_bias"].shape[1] // 2
    for name, tensor in ckpt.items():
        param = getattr(moe, name)
        for e in range(E):
            if name.startswith("w2"):
                moe.expert_loader(param, tensor[e], (e, "down"))
            else:
                moe.expert_loader(param, tensor[e, :inter], (e, "gate"))
                moe.expert_loader(param, tensor[e, inter:], (e, "up"))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mxfp4_shards_in_whole_groups_padded_with_zeros_add_up_to_the_whole_layer(tp):
    """Intermediate 160 is 5 groups of 32: over 4 ranks 2, 2, 1 and 0 real groups, each rank 2 groups wide; over 8,
    three ranks hold only padding. Whatever the padding held before (random weights fill it all), it adds nothing."""
    ckpt, inter = _mxfp4_checkpoint(160, seed=5), 160
    act = functools.partial(clamped_swiglu, alpha=1.702, limit=7.0)
    whole = FusedMoE(E, H, inter, bias=True, activation=act, quant="mxfp4")
    _load_mxfp4(whole, ckpt)
    x = _tokens(11)
    weights, ids = route_softmax_topk(torch.randn(11, E, generator=torch.Generator().manual_seed(6)), K, True)
    want = whole(x, weights, ids)
    total = torch.zeros_like(want)
    for rank in range(tp):
        shard = FusedMoE(E, H, inter, ParallelState(rank, tp), bias=True, activation=act, quant="mxfp4")
        assert shard.inter == 32 * -(-5 // tp)
        for param in shard.parameters():  # garbage in the padding, as random weights leave it
            param.data.copy_(torch.randint(0, 200, param.shape).to(param.dtype))
        shard.clear_padding()
        _load_mxfp4(shard, ckpt)
        total += shard(x, weights, ids, reduce=False)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-5)


def test_mxfp4_experts_in_the_kernels_byte_order_give_the_same_output():
    """The layer's reference path reads experts held in the fused kernel's byte order (as the GPU holds them once
    filled) back in checkpoint order; off the GPU, filling leaves them in checkpoint order."""
    ckpt = _mxfp4_checkpoint(64, seed=8)
    moe = FusedMoE(E, H, 64, bias=True, activation=functools.partial(clamped_swiglu, alpha=1.702, limit=7.0),
                   quant="mxfp4")
    _load_mxfp4(moe, ckpt)
    moe.weights_filled()
    assert not moe.kernel_layout and torch.equal(moe.w2_weight.data, ckpt["w2_weight"])
    x = _tokens(9)
    weights, ids = route_softmax_topk(torch.randn(9, E, generator=torch.Generator().manual_seed(9)), K, True)
    want = moe(x, weights, ids)
    for param in (moe.w13_weight, moe.w2_weight):
        param.data.copy_(to_kernel_layout(param.data))
    moe.kernel_layout = True
    torch.testing.assert_close(moe(x, weights, ids), want, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernel's byte order is the GPU's")
def test_mxfp4_experts_on_a_gpu_take_the_kernels_byte_order_from_the_start():
    """Graphs captured while the checkpoint loads beside them bake the layer's byte order into their kernels: it is
    the order the weights end in before any weight is filled, and filling converts the bytes, not the flag."""
    ckpt = _mxfp4_checkpoint(64, seed=8)
    with torch.device("cuda"):
        moe = FusedMoE(E, H, 64, bias=True, activation=functools.partial(clamped_swiglu, alpha=1.702, limit=7.0),
                       quant="mxfp4")
    assert moe.kernel_layout
    _load_mxfp4(moe, {name: t.cuda() for name, t in ckpt.items()})
    moe.weights_filled()
    assert moe.kernel_layout and torch.equal(moe.w2_weight.data.cpu(), to_kernel_layout(ckpt["w2_weight"]))


def test_mxfp4_checkpoint_of_another_width_is_refused_with_its_shape():
    moe = FusedMoE(E, H, 64, ParallelState(1, 2), bias=True, quant="mxfp4")
    with pytest.raises(ValueError, match=r"expert 0 down: checkpoint shape \(64, 48\) does not hold"):
        moe.expert_loader(moe.w2_weight, torch.zeros(H, 48, dtype=torch.uint8), (0, "down"))
