"""YaRN rope scaling gives HF transformers' frequencies and attention factor, and the rotary tables carry it."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from railyard.engine.runner.layers.rotary import RotaryEmbedding, inverse_frequencies, yarn_attention_factor

GPT_OSS_YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                    original_max_position_embeddings=4096)
SCALINGS = {
    "gpt-oss (truncate false)": (64, 150000.0, GPT_OSS_YARN),
    "qwen-style (truncate default)": (128, 1000000.0, dict(rope_type="yarn", factor=4.0,
                                                             original_max_position_embeddings=32768)),
    "deepseek mscale": (64, 10000.0, dict(rope_type="yarn", factor=40.0, mscale=1.0, mscale_all_dim=0.707,
                                          original_max_position_embeddings=4096, beta_fast=32, beta_slow=1)),
    "given attention factor": (32, 10000.0, dict(rope_type="yarn", factor=8.0, attention_factor=0.9,
                                                 original_max_position_embeddings=256)),
}


def _hf(head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    config = GptOssConfig(head_dim=head_dim, num_attention_heads=4, hidden_size=4 * head_dim,
                          max_position_embeddings=scaling["original_max_position_embeddings"] * 4,
                          rope_parameters={**scaling, "rope_theta": theta})
    return ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")


@pytest.mark.parametrize("name", list(SCALINGS))
def test_yarn_frequencies_and_attention_factor_are_hf_transformers(name):
    head_dim, theta, scaling = SCALINGS[name]
    want_freq, want_factor = _hf(head_dim, theta, scaling)
    assert torch.equal(inverse_frequencies(head_dim, theta, scaling), want_freq)
    assert yarn_attention_factor(scaling) == pytest.approx(want_factor, rel=1e-12)


def test_yarn_tables_scale_cos_and_sin_by_the_attention_factor():
    plain = RotaryEmbedding(64, 256, 150000.0, None)
    yarn = RotaryEmbedding(64, 256, 150000.0, GPT_OSS_YARN)
    factor = yarn_attention_factor(GPT_OSS_YARN)
    assert factor > 1.0
    norm = (yarn.cos ** 2 + yarn.sin ** 2).sqrt()
    torch.testing.assert_close(norm, torch.full_like(norm, factor))
    assert not torch.allclose(yarn.cos, plain.cos * factor), "YaRN changes the frequencies too, not only the scale"
