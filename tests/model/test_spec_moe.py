"""The model description of a mixture of experts: which layers hold experts and how many parameters it has (all
experts) and multiplies per token (top-k), against HF transformers' Qwen3-MoE built from the same config."""

from __future__ import annotations

import pytest
import torch
import transformers

from railyard.engine.startup.tiny_model import tiny_config
from railyard.errors import ConfigError, ModelLoadError
from railyard.model.spec import ModelSpec, check_tensor_parallel

# 6 layers, every second one sparse (1, 3, 5) except layer 3: experts in layers 1 and 5.
CONFIG = tiny_config("qwen3moe", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])


@pytest.fixture(scope="module")
def hf_model():
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in CONFIG.items() if k != "architectures"})
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def test_the_layers_with_experts_are_those_hf_builds_with_experts(hf_model):
    spec = ModelSpec.from_hf_config(CONFIG)
    hf = tuple(i for i, layer in enumerate(hf_model.model.layers) if hasattr(layer.mlp, "experts"))
    assert spec.moe_layers == hf == (1, 5)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (8, 2, 32)
    assert spec.norm_topk_prob and spec.is_moe and spec.num_dense_layers == 4


def test_parameter_count_is_hfs_with_every_expert(hf_model):
    assert ModelSpec.from_hf_config(CONFIG).num_params() == sum(p.numel() for p in hf_model.parameters())


def test_a_token_multiplies_by_its_top_k_experts_and_the_router_only():
    spec = ModelSpec.from_hf_config(CONFIG)
    h, d = 64, 32
    attention = (4 + 2 * 2) * d * h + 4 * d * h
    dense, expert, router = 3 * h * 128, 3 * h * 32, 8 * h
    assert spec.active_linear_params == 6 * attention + 4 * dense + 2 * (2 * expert + router)
    assert spec.matmul_params == spec.active_linear_params + 259 * h


def test_a_step_reads_the_experts_its_tokens_are_expected_to_hit():
    spec = ModelSpec.from_hf_config(CONFIG)
    one_expert = 3 * 64 * 32 * spec.dtype_bytes
    assert spec.expected_experts_hit(1) == pytest.approx(2)  # one token: its top-2
    assert spec.expected_experts_hit(2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    assert spec.expected_experts_hit(10_000) == pytest.approx(8)
    assert spec.step_weight_bytes(1) == pytest.approx(spec.matmul_weight_bytes - 2 * 6 * one_expert)
    dense = ModelSpec.from_hf_config(tiny_config("qwen3"))
    assert dense.step_weight_bytes(1) == dense.step_weight_bytes(256) == dense.matmul_weight_bytes


def test_fp8_experts_carry_one_float32_scale_per_128_by_128_block():
    spec = ModelSpec.from_hf_config(CONFIG)
    fp8 = spec.with_precision(quantization="fp8")
    # per MoE layer and expert: gate and up [32, 64] one block each, down [64, 32] one block -> 3 scales
    dense_scales = 4 * ((4 + 2 * 2) * 32 + 64 + 2 * 128 + 64)
    moe_scales = 2 * ((4 + 2 * 2) * 32 + 64 + 8 * 3)
    assert fp8.linear_scale_bytes() == 4 * (dense_scales + moe_scales)
    assert fp8.weight_bytes() == spec.weight_bytes() - spec.linear_params() * 3 + fp8.linear_scale_bytes()


def test_tensor_parallel_must_split_the_experts_intermediate_width():
    spec = ModelSpec.from_hf_config({**CONFIG, "moe_intermediate_size": 34})
    check_tensor_parallel(spec, 2)
    with pytest.raises(ConfigError, match="expert intermediate size 34"):
        check_tensor_parallel(spec, 4)


def test_fp8_experts_split_over_ranks_only_at_whole_scale_blocks():
    spec = ModelSpec.from_hf_config({**CONFIG, "moe_intermediate_size": 768}).with_precision(quantization="fp8")
    check_tensor_parallel(spec, 2)  # 384 = 3 blocks per rank
    with pytest.raises(ConfigError, match="FP8 experts' 128-wide scale blocks"):
        check_tensor_parallel(spec, 4)  # 192: a block split between ranks


@pytest.mark.parametrize(("change", "message"), [
    (dict(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds num_experts 8"),
    (dict(mlp_only_layers="2"), "'mlp_only_layers' must be a list of layer indices"),
    (dict(shared_expert_intermediate_size=64), "shared experts"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size"),
])
def test_moe_configs_railyard_cannot_run_are_refused(change, message):
    with pytest.raises(ModelLoadError, match=message):
        ModelSpec.from_hf_config({**CONFIG, **change})
