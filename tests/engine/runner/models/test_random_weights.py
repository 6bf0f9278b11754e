"""Random weights for the named shapes' benchmarks: gpt-oss's experts are drawn as MXFP4 bytes and exponents, as the
real checkpoints ship them, and a tensor-parallel rank's padded expert columns stay zero (they must add nothing)."""

from __future__ import annotations

import torch

from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
from railyard.engine.runner.layers.parallel import ParallelState
from railyard.engine.runner.models.loader import build_empty, random_weights
from railyard.model.spec import ModelSpec
from railyard.shapes import shape_config

# gpt-oss-20b's config, two layers of 8 experts 160 wide: 5 groups of 32, over 4 ranks 2, 2, 1 and 0 real ones
TINY = dict(shape_config("gpt-oss-20b"), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_local_experts=8, vocab_size=300,
            layer_types=["sliding_attention", "full_attention"])


def _experts(rank: int, tp: int):
    spec = ModelSpec.from_hf_config(TINY)
    model = build_empty(spec, torch.float32, torch.device("cpu"), TorchAttentionBackend, ParallelState(rank, tp))
    return random_weights(model, seed=0).model.layers[0].mlp.experts


def test_gpt_oss_shape_draws_mxfp4_experts():
    experts = _experts(0, 1)
    assert experts.quant == "mxfp4"
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == torch.uint8
    assert experts.w13_weight.shape == (8, 2 * 160, 64 // 2) and experts.w2_weight_scale.shape == (8, 64, 160 // 32)
    assert len(experts.w13_weight.unique()) > 200  # random e2m1 pairs, not a constant


def test_a_padded_ranks_random_experts_are_zero_past_its_real_columns():
    experts = _experts(2, 4)  # 1 real group of the 2 it holds
    assert experts.inter == 64 and experts.shard.real == 32
    for half in (0, 64):
        assert experts.w13_weight[:, half + 32:half + 64].eq(0).all()
        assert experts.w13_bias[:, half + 32:half + 64].eq(0).all()
        assert experts.w13_weight[:, half:half + 32].ne(0).any()
    assert experts.w2_weight[..., 16:].eq(0).all() and experts.w2_weight[..., :16].ne(0).any()
    assert experts.w2_weight_scale[..., 1:].eq(0).all()
