"""The roofline of docs/architecture.md's performance model, checked against arithmetic done by hand."""

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


def test_fp8_weights_read_one_byte_per_linear_weight_while_the_lm_head_keeps_two():
    fp8 = TOY.with_precision(kv_cache_dtype="fp8", quantization="fp8")
    assert TOY.matmul_weight_bytes == 184 * 2
    assert fp8.matmul_weight_bytes == 144 * 1 + 40 * 2
    assert fp8.kv_bytes_per_token() == TOY.kv_bytes_per_token() // 2


def test_fp8_linear_layers_multiply_at_the_fp8_rate_and_the_rest_at_the_bf16_rate():
    fp8 = TOY.with_precision(kv_cache_dtype="fp8", quantization="fp8")
    peak, bw = 1e-12, 1e-12  # 1 FLOP/s, 1 byte/s; the FP8 linear layers at 2 FLOP/s
    r = offline_roofline(fp8, prompt_lens=[3], output_lens=[2], peak_tflops=peak, hbm_tbs=bw, fp8_peak_tflops=2 * peak)
    prefill = 2 * 144 * 3 / 2 + 4 * 3 * 2 * 2 * 2 * 1 + 2 * 40
    assert r.prefill_s == pytest.approx(prefill)
    decode_flops = 2 * 144 / 2 + 2 * 40 + 4 * 1 * 4 * 2 * 2 * 1
    decode_bytes = 144 + 40 * 2 + 4 * 4  # FP8 layers, bf16 LM head, 4 tokens of FP8 KV
    assert r.decode_s == pytest.approx(max(decode_flops, decode_bytes))
    assert r.fp8_peak_tflops == 2 * peak


def test_unquantized_models_multiply_at_the_model_dtypes_rate_whatever_the_fp8_peak():
    r = offline_roofline(TOY, prompt_lens=[3], output_lens=[2], peak_tflops=1e-12, hbm_tbs=1e-12,
                         fp8_peak_tflops=2e-12)
    assert r.prefill_s == pytest.approx(2 * 144 * 3 + 4 * 3 * 2 * 2 * 2 * 1 + 2 * 40)
    assert r.fp8_peak_tflops is None
