"""The model description: parsed once from config.json, refusing what railyard cannot run, sizes from dtypes."""

from __future__ import annotations

import json

import pytest

from railyard.errors import ConfigError, ModelLoadError
from railyard.model.spec import ModelSpec, check_tensor_parallel, read_model_spec
from railyard.shapes import shape_config, shape_names


def _config(**changes) -> dict:
    cfg = shape_config("qwen2-7b")
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


# (change to Qwen2-7B's config.json, what the description says)
MALFORMED = [
    (dict(architectures=["GPT2LMHeadModel"]), "unsupported architecture ['GPT2LMHeadModel']"),
    (dict(architectures=None, model_type="gpt2"), "unsupported architecture 'gpt2'"),
    (dict(use_sliding_window=True), "sliding-window attention (use_sliding_window: true) is not supported"),
    (dict(mlp_bias=True), "mlp_bias: true is not supported"),
    (dict(hidden_size=None), "config.json lacks required field 'hidden_size'"),
    (dict(vocab_size=None), "config.json lacks required field 'vocab_size'"),
    (dict(num_hidden_layers="28"), "config.json field 'num_hidden_layers' must be a positive integer, got '28'"),
    (dict(num_attention_heads=0), "config.json field 'num_attention_heads' must be a positive integer, got 0"),
    (dict(num_key_value_heads=5), "num_attention_heads 28 is not a multiple of num_key_value_heads 5"),
    (dict(head_dim=127), "head_dim 127 is odd"),
    (dict(rope_theta=-1), "config.json field 'rope_theta' must be a positive number, got -1"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 4.0}), "rope scaling type 'longrope' is not supported"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "rope_scaling yarn needs a positive original_max_position_embeddings, got None"),
    (dict(rope_scaling={"rope_type": "linear"}), "rope_scaling linear needs a positive factor, got None"),
    (dict(eos_token_id="</s>"), "'eos_token_id' must be a token id or a list of them"),
    (dict(quantization_config={"quant_method": "awq", "bits": 4}), "quantization method 'awq' is not supported"),
    (dict(quantization_config={"bits": 4}), "quantization_config must name its quant_method"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]}), "block-wise FP8 scales of"),
]


@pytest.mark.parametrize(("change", "message"), MALFORMED)
def test_a_config_railyard_cannot_run_is_refused_with_what_is_wrong(change, message):
    with pytest.raises(ModelLoadError) as err:
        ModelSpec.from_hf_config(_config(**change))
    assert message in str(err.value)


@pytest.mark.parametrize("name", shape_names())
def test_named_shapes_are_accepted_and_stored_in_their_checkpoint_dtype(name):
    spec = ModelSpec.from_hf_config(shape_config(name))
    assert (spec.dtype, spec.kv_cache_dtype, spec.quantization) == ("bfloat16", "auto", None)


def test_reading_a_checkpoint_directory_parses_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(shape_config("llama3-8b")))
    assert read_model_spec(tmp_path) == ModelSpec.from_hf_config(shape_config("llama3-8b"))


def test_a_config_json_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ModelLoadError, match="is not valid JSON"):
        read_model_spec(tmp_path)


def test_weight_and_kv_bytes_follow_the_element_size_of_the_precision():
    bf16 = ModelSpec.from_hf_config(shape_config("qwen3-0.6b"))
    fp32 = bf16.with_precision("float32")
    assert fp32.weight_bytes() == 2 * bf16.weight_bytes() == 4 * bf16.num_params()
    assert fp32.kv_bytes_per_token() == 2 * bf16.kv_bytes_per_token() == 2 * 28 * 8 * 128 * 4
    assert fp32.matmul_weight_bytes == 2 * bf16.matmul_weight_bytes == 4 * bf16.matmul_params


def test_fp8_weights_take_one_byte_and_a_float32_scale_per_output_channel_and_an_fp8_cache_one_byte():
    bf16 = ModelSpec.from_hf_config(shape_config("qwen2-7b"))
    fp8 = bf16.with_precision(kv_cache_dtype="fp8", quantization="fp8")
    linear = bf16.num_layers * bf16.layer_linear_params()
    # qkv (28 + 2 * 4) * 128 rows, o 3584, gate/up 2 * 18944, down 3584: one float32 scale each, per layer
    scales = 28 * ((28 + 2 * 4) * 128 + 3584 + 2 * 18944 + 3584) * 4
    assert fp8.weight_bytes() == bf16.weight_bytes() - linear + scales
    assert fp8.kv_bytes_per_token() == bf16.kv_bytes_per_token() // 2 == 28 * 2 * 4 * 128
    assert fp8.matmul_weight_bytes == bf16.matmul_weight_bytes - linear
    assert (fp8.matmul_precision, bf16.matmul_precision) == ("fp8", "bfloat16")


def test_a_checkpoints_own_fp8_quantization_is_kept_unless_a_run_names_one():
    spec = ModelSpec.from_hf_config(_config(quantization_config={"quant_method": "fp8"}))
    assert spec.quantization == "fp8" and spec.with_precision("auto").quantization == "fp8"
    assert ModelSpec.from_hf_config(_config()).with_precision(quantization="fp8").quantization == "fp8"


def test_auto_precision_is_the_checkpoints_dtype_on_a_gpu_and_float32_on_the_cpu():
    spec = ModelSpec.from_hf_config(shape_config("qwen2-7b"))
    assert spec.with_precision("auto", device_type="cuda").dtype == "bfloat16"
    assert spec.with_precision("auto", device_type="cpu").dtype == "float32"
    assert spec.with_precision("float16", device_type="cpu").dtype == "float16"


@pytest.mark.parametrize(("option", "message"), [
    (dict(kv_cache_dtype="int8"), "kv_cache_dtype must be one of auto, bfloat16, fp8; got 'int8'"),
    (dict(quantization="int4"), "quantization must be fp8 (or unset), got 'int4'"),
    (dict(dtype="float8"), "dtype must be one of auto, float32, bfloat16, float16; got 'float8'"),
])
def test_a_precision_railyard_does_not_run_is_a_config_error(option, message):
    spec = ModelSpec.from_hf_config(shape_config("qwen2-7b"))
    with pytest.raises(ConfigError) as err:
        spec.with_precision(**option)
    assert message in str(err.value)


def test_tensor_parallel_ranks_hold_their_shard_and_replicate_scarce_kv_heads():
    spec = ModelSpec.from_hf_config(shape_config("qwen2-7b"))  # 28 heads, 4 KV heads
    assert spec.kv_heads_per_rank(2) == 2 and spec.kv_heads_per_rank(4) == 1
    assert spec.kv_bytes_per_token(2) * 2 == spec.kv_bytes_per_token(1)
    assert spec.kv_bytes_per_token(4) == spec.kv_bytes_per_token(1) // 4
    # Norms stay whole on every rank; everything else is split, so two ranks hold a little more than one model.
    assert spec.num_params(1) < 2 * spec.num_params(2) < spec.num_params(1) * 1.001


def test_a_tensor_parallel_size_that_splits_no_head_evenly_is_refused():
    spec = ModelSpec.from_hf_config(shape_config("qwen2-7b"))
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide the model's 28 attention heads"):
        check_tensor_parallel(spec, 3)
    check_tensor_parallel(spec, 4)
