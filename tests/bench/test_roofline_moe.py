"""The roofline of a mixture of experts: a token multiplies by its active parameters only, and a decode step reads
the experts its tokens are expected to hit (uniform top-k routing), checked by hand on a toy and against the
published figures of Qwen3-30B-A3B."""

from __future__ import annotations

import pytest

from railyard.bench.roofline import offline_roofline
from railyard.model.spec import ModelSpec
from railyard.shapes import shape_config

# one MoE layer, hidden 4, 2 heads of dim 2 (1 KV head), 4 experts of width 2, top-2, vocab 10, bf16
TOY = ModelSpec.from_hf_config(dict(
    architectures=["Qwen3MoeForCausalLM"], hidden_size=4, intermediate_size=8, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=2, vocab_size=10, torch_dtype="bfloat16",
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=2))


def test_a_token_multiplies_attention_its_two_experts_and_the_router():
    # qkv 4*(2+2)*2=32, o 16; one expert 3*4*2=24, two of them 48; router 4*4=16; lm head 40
    assert TOY.matmul_params == 32 + 16 + 48 + 16 + 40


def test_decode_reads_the_experts_that_its_batch_is_expected_to_hit():
    peak, bw = 1e-12, 1e-12  # 1 FLOP/s and 1 byte/s
    r = offline_roofline(TOY, prompt_lens=[3], output_lens=[2], peak_tflops=peak, hbm_tbs=bw)
    flops = 2 * (48 + 48 + 16) + 2 * 40 + 4 * 1 * 4 * 2 * 2 * 1  # one token seeing 4 keys
    reads = (48 + 2 * 24 + 16 + 40) * 2 + 4 * 4 * 2  # attention, its 2 experts, router, LM head + KV of 4 tokens
    assert r.decode_s == pytest.approx(max(flops, reads))
    two = offline_roofline(TOY, prompt_lens=[3, 3], output_lens=[2, 2], peak_tflops=peak, hbm_tbs=bw)
    hit = 4 * (1 - (1 - 2 / 4) ** 2)  # two tokens: 3 of the 4 experts expected
    assert two.decode_s == pytest.approx(max(2 * flops, (48 + hit * 24 + 16 + 40) * 2 + 2 * 4 * 4 * 2))


def test_qwen3_30b_a3b_activates_its_published_3_3b_of_30_5b_parameters():
    spec = ModelSpec.from_hf_config(shape_config("qwen3-30b-a3b"))
    active = spec.matmul_params + spec.vocab_size * spec.hidden_size  # the model card counts the embedding too
    assert active == pytest.approx(3.3e9, rel=0.02)
    assert spec.num_params() == pytest.approx(30.5e9, rel=0.01)
    # a decode step of one token reads 8 of 128 experts a layer; one of 256 reads nearly all of them
    assert spec.step_weight_bytes(1) < 0.11 * spec.matmul_weight_bytes
    assert spec.step_weight_bytes(256) == pytest.approx(spec.matmul_weight_bytes, rel=1e-3)
