"""A PEFT adapter is checked against the base model before any of it is used: every way it can be wrong is refused
with an InvalidRequestError that says what and how to fix it; a good one reports its modules, ranks and scaling."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from railyard.engine.lora.peft import inspect_adapter
from railyard.engine.lora.request import LoRARequest
from railyard.errors import InvalidRequestError
from railyard.model.spec import read_model_spec
from tests.engine.lora.adapters import write_adapter


@pytest.fixture(scope="module")
def good(tiny_models, tmp_path_factory) -> str:
    return write_adapter(tiny_models["qwen2"], tmp_path_factory.mktemp("good") / "a", r=8, lora_alpha=32,
                         target_modules=["q_proj", "v_proj", "down_proj"])


def _inspect(tiny_models, path, max_rank: int = 16):
    return inspect_adapter(LoRARequest("x", 1, str(path)), read_model_spec(tiny_models["qwen2"]), max_rank)


def test_a_peft_adapter_reports_its_modules_ranks_and_scaling(tiny_models, good):
    adapter = _inspect(tiny_models, good)
    assert adapter.modules == ["q_proj", "v_proj", "down_proj"]
    assert set(adapter.ranks.values()) == {8} and len(adapter.ranks) == 3 * 2  # two layers
    assert adapter.scaling(8) == 4.0


def test_rslora_scales_by_the_square_root_of_the_rank(tiny_models, tmp_path):
    path = write_adapter(tiny_models["qwen2"], tmp_path / "a", r=16, lora_alpha=8, use_rslora=True,
                         target_modules=["o_proj"])
    assert _inspect(tiny_models, path).scaling(16) == 2.0


def test_an_adapter_trained_on_another_model_is_refused_for_its_shapes(tiny_models, tmp_path):
    path = write_adapter(tiny_models["qwen3"], tmp_path / "a", r=8, lora_alpha=8, target_modules=["q_proj"])
    with pytest.raises(InvalidRequestError, match=r"do not fit this model .*another model"):
        _inspect(tiny_models, path)


def test_a_rank_over_max_lora_rank_is_refused_with_the_flag_that_fixes_it(tiny_models, good):
    with pytest.raises(InvalidRequestError, match="rank 8 is over max_lora_rank 4.*--max-lora-rank 8"):
        _inspect(tiny_models, good, max_rank=4)


def test_a_directory_without_the_adapter_files_is_refused(tiny_models, good, tmp_path):
    with pytest.raises(InvalidRequestError, match="is not a directory"):
        _inspect(tiny_models, tmp_path / "missing")
    with pytest.raises(InvalidRequestError, match="has no adapter_config.json"):
        _inspect(tiny_models, tmp_path)
    shutil.copy(f"{good}/adapter_config.json", tmp_path)
    with pytest.raises(InvalidRequestError, match="has no adapter_model.safetensors"):
        _inspect(tiny_models, tmp_path)


def test_pickled_weights_are_refused_and_never_read(tiny_models, good, tmp_path):
    shutil.copy(f"{good}/adapter_config.json", tmp_path)
    torch.save({"anything": torch.zeros(1)}, tmp_path / "adapter_model.bin")
    with pytest.raises(InvalidRequestError, match="adapter_model.bin is a pickle.*safe_serialization"):
        _inspect(tiny_models, tmp_path)


def test_a_module_the_decoder_projections_do_not_include_is_refused(tiny_models, tmp_path):
    path = write_adapter(tiny_models["qwen2"], tmp_path / "a", r=4, lora_alpha=4, target_modules=["lm_head"])
    with pytest.raises(InvalidRequestError, match="lm_head.*railyard adapts q_proj, k_proj"):
        _inspect(tiny_models, path)


@pytest.mark.parametrize("option, value, what", [("use_dora", True, "DoRA"), ("bias", "all", "trains biases"),
                                                 ("modules_to_save", ["lm_head"], "modules_to_save")])
def test_peft_features_beyond_plain_lora_are_refused_not_ignored(tiny_models, good, tmp_path, option, value, what):
    shutil.copytree(good, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config | {option: value}))
    with pytest.raises(InvalidRequestError, match=what):
        _inspect(tiny_models, tmp_path / "a")


def test_a_truncated_weights_file_is_refused(tiny_models, good, tmp_path):
    shutil.copytree(good, tmp_path / "a")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(InvalidRequestError, match="not a readable safetensors file"):
        _inspect(tiny_models, tmp_path / "a")
