"""The roofline of DESIGN.md's performance model, checked against arithmetic done by hand."""

from __future__ import annotations

import pytest

from railyard.bench.roofline import offline_roofline
from railyard.model.spec import ModelSpec
from railyard.shapes import shape_config

# one layer, hidden 4, ffn 8, 2 heads of dim 2 (1 KV head), vocab 10, bf16: easy to count by hand
TOY = ModelSpec.from_hf_config(dict(
    architectures=["LlamaForCausalLM"], hidden_size=4, intermediate_size=8, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=2, vocab_size=10, torch_dtype="bfloat16"))


def test_toy_shape_counts_weights_and_kv_by_hand():
    # qkv 4*(2+2)*2=32, o 2*2*4=16, mlp 3*4*8=96 -> 144 per layer; + lm head 10*4=40
    assert TOY.matmul_params == 184
    assert TOY.kv_bytes_per_token() == 2 * 1 * 1 * 2 * 2


def test_prefill_is_flops_over_peak_and_decode_step_takes_the_larger_bound():
    peak, bw = 1e-12, 1e-12  # 1 FLOP/s and 1 byte/s keep the arithmetic readable
    r = offline_roofline(TOY, prompt_lens=[3], output_lens=[2], peak_tflops=peak, hbm_tbs=bw)
    prefill = 2 * 144 * 3 + 4 * 3 * 2 * 2 * 2 * 1 + 2 * 40  # layers + attention (avg 2 keys) + one LM head row
    assert r.prefill_s == pytest.approx(prefill)
    decode_flops = 2 * 144 + 2 * 40 + 4 * 1 * 4 * 2 * 2 * 1  # one token seeing 4 keys
    decode_bytes = 184 * 2 + 4 * 8  # weights + KV of 4 tokens
    assert r.decode_steps == 1
    assert r.decode_s == pytest.approx(max(decode_flops, decode_bytes))


def test_qwen2_7b_shape_has_its_published_parameter_count():
    assert ModelSpec.from_hf_config(shape_config("qwen2-7b")).num_params() == pytest.approx(7.62e9, rel=0.01)
    assert ModelSpec.from_hf_config(shape_config("qwen3-0.6b")).num_params() == pytest.approx(0.596e9, rel=0.02)
