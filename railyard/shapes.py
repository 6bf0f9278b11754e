"""Named model shapes as HF config dicts, for benchmarks with random weights (no weights travel).

Torch-free: the bench CLI and the cluster planner can read a shape without importing the engine.
The numbers are those of the public checkpoints' config.json files.
"""

from __future__ import annotations

import copy

from railyard.errors import ConfigError

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

