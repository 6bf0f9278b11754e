"""Named model shapes are HF config dicts the model description (ModelSpec) accepts."""

from __future__ import annotations

import pytest

from railyard.model.spec import ModelSpec
from railyard.errors import ConfigError
from railyard.shapes import shape_config, shape_names


@pytest.mark.parametrize("name", shape_names())
def test_every_shape_builds_a_model_spec(name):
    spec = ModelSpec.from_hf_config(shape_config(name))
    assert spec.num_heads % spec.num_kv_heads == 0 and spec.head_dim * spec.num_heads > 0


def test_unknown_shape_names_the_known_ones():
    with pytest.raises(ConfigError, match="qwen2-7b"):
        shape_config("gpt-5")
