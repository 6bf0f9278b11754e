"""Which pre-quantized checkpoints the model description accepts, from config.json's quantization_config alone
(torch-free: the planner refuses them as the engine does). Loading them: tests/engine/runner/models/test_fp8_checkpoints.py."""

from __future__ import annotations

import pytest

from railyard.errors import ModelLoadError
from railyard.model.quant_config import checkpoint_block_scales, checkpoint_quantization

CHANNEL_GROUP = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
                 "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}


@pytest.mark.parametrize("qc", [
    {"quant_method": "fp8", "activation_scheme": "dynamic"},
    {"quant_method": "fp8", "activation_scheme": "static"},
    {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": CHANNEL_GROUP}},
])
def test_vllm_fp8_and_compressed_tensors_fp8_checkpoints_are_fp8(qc):
    assert checkpoint_quantization({"quantization_config": qc}) == "fp8"
    assert not checkpoint_block_scales({"quantization_config": qc})
    assert checkpoint_quantization({}) is None


BLOCK_GROUP = {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128],
                           "symmetric": True}, "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}


@pytest.mark.parametrize("qc", [
    {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
    {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": BLOCK_GROUP}},
], ids=["qwen3-30b-a3b-fp8", "compressed-tensors-block"])
def test_fp8_checkpoints_with_128_by_128_block_scales_are_fp8_with_block_scales(qc):
    assert checkpoint_quantization({"quantization_config": qc}) == "fp8"
    assert checkpoint_block_scales({"quantization_config": qc})


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]},
     "weight_block_size \\[64, 64\\] are not supported"),
    ({"quant_method": "gptq", "bits": 4}, "quantization method 'gptq' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}, "format 'pack-quantized'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [32, 32]}}}},
     "strategy='block', block_structure=\\[32, 32\\]"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}}, "format 'int-quantized'"),
])
def test_unsupported_quantization_configs_are_refused_with_the_reason(qc, message):
    with pytest.raises(ModelLoadError, match=message):
        checkpoint_quantization({"quantization_config": qc})
