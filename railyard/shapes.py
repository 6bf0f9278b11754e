"""Named model shapes as HF config dicts, for benchmarks with random weights (no weights travel).

Torch-free: the bench CLI and the cluster planner can read a shape without importing the engine.
The numbers are those of the public checkpoints' config.json files.
"""

from __future__ import annotations

import copy

from railyard.errors import ConfigError

# gpt-oss-20b and -120b differ in depth and expert count only; their experts are MXFP4 as the checkpoints ship them.
_GPT_OSS = dict(
    architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_experts_per_tok=4, experts_per_token=4,
    sliding_window=128, vocab_size=201088, max_position_embeddings=131072, rope_theta=150000, rms_norm_eps=1e-5,
    rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                      original_max_position_embeddings=4096),
    swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False, torch_dtype="bfloat16", pad_token_id=199999,
    eos_token_id=200002, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})

SHAPES: dict[str, dict] = {
    "qwen2-7b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
        use_sliding_window=False, torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151643),
    "qwen3-0.6b": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, use_sliding_window=False, torch_dtype="bfloat16", bos_token_id=151643,
        eos_token_id=151645),
    "llama3-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, torch_dtype="bfloat16", bos_token_id=128000,
        eos_token_id=128001),
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
        torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645),
    "gpt-oss-20b": dict(_GPT_OSS, num_hidden_layers=24, num_local_experts=32,
                        layer_types=["sliding_attention", "full_attention"] * 12),
    "gpt-oss-120b": dict(_GPT_OSS, num_hidden_layers=36, num_local_experts=128,
                         layer_types=["sliding_attention", "full_attention"] * 18),
}


def shape_names() -> list[str]:
    return sorted(SHAPES)


def is_shape(name: str) -> bool:
    return name in SHAPES


def shape_config(name: str) -> dict:
    """A copy of the HF config dict of a named shape; ConfigError names the known ones."""
    if name not in SHAPES:
        raise ConfigError(f"unknown model shape {name!r}; known shapes: {', '.join(shape_names())}")
    return copy.deepcopy(SHAPES[name])

