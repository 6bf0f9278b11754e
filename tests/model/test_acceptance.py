"""`railyard plan` refuses what the engine refuses, with the engine's own message: both run the same checks.

The engine side is the real `railyard generate` / `railyard bench throughput` (each refuses before loading
any weight); the planner side is the real `railyard plan` over a stack naming the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from railyard.cli import main
from railyard.model.spec import ModelSpec
from railyard.shapes import shape_config, shape_names

from .test_spec import MALFORMED, _config

NODES = Path(__file__).parents[1] / "cluster" / "fixtures" / "doctor" / "good" / "nodes.json"


def _error(argv: list[str], capsys) -> str:
    """The one-line error of a railyard command that must refuse its input (exit 2), without its prefix."""
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line
    return line.split(": error: ", 1)[1]


def _stack(tmp_path: Path, model: dict) -> str:
    """A stack file of one model named 'm' on H200s."""
    stack = {"image": "ghcr.io/example/railyard:0.1.0", "gpu_product": "NVIDIA-H200",
             "models": [{"name": "m", **model}]}
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(stack))
    return str(path)


def _plan_error(tmp_path: Path, capsys, model: dict) -> str:
    message = _error(["plan", "--nodes", str(NODES), "-c", _stack(tmp_path, model)], capsys)
    assert message.startswith("model 'm': ")
    return message.removeprefix("model 'm': ")


def _plan_sizing(tmp_path: Path, capsys, model: dict) -> dict:
    assert main(["plan", "--nodes", str(NODES), "-c", _stack(tmp_path, model), "--json"]) == 0
    (sizing,) = json.loads(capsys.readouterr().out)["sizing"]
    return sizing


@pytest.mark.parametrize(("change", "message"), MALFORMED)
def test_a_config_json_the_engine_refuses_is_refused_by_plan_with_the_same_message(tmp_path, capsys, change,
                                                                                      message):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(_config(**change)))
    engine = _error(["generate", "--model", str(checkpoint), "--prompt", "hi"], capsys)
    assert message in engine
    assert _plan_error(tmp_path, capsys, {"model": str(checkpoint)}) == engine


@pytest.mark.parametrize("name", shape_names())
def test_a_tensor_parallel_size_the_engine_refuses_is_refused_by_plan_with_the_same_message(tmp_path, capsys,
                                                                                           name):
    tp = 3  # divides none of the named shapes' head counts
    engine = _error(["bench", "throughput", "--model", name, "--tensor-parallel-size", str(tp)], capsys)
    assert engine.startswith(f"tensor_parallel_size {tp} does not divide the model's")
    plan = _plan_error(tmp_path, capsys, {"model": f"/models/{name}", "shape": name, "tensor_parallel_size": tp,
                                          "resources": {"cpu": "8"}})
    assert plan == engine


@pytest.mark.parametrize("name", shape_names())
def test_a_max_model_len_beyond_the_models_positions_is_refused_by_both(tmp_path, capsys, name):
    too_long = shape_config(name)["max_position_embeddings"] * 2
    engine = _error(["bench", "throughput", "--model", name, "--max-model-len", str(too_long)], capsys)
    assert engine.startswith(f"max_model_len {too_long} exceeds the model's max_position_embeddings")
    plan = _plan_error(tmp_path, capsys, {"model": f"/models/{name}", "shape": name,
                                          "engine": {"max_model_len": too_long}})
    assert plan == engine


@pytest.mark.parametrize("name", shape_names())
def test_every_named_shape_is_accepted_and_sized_by_plan(tmp_path, capsys, name):
    sizing = _plan_sizing(tmp_path, capsys, {"model": f"/models/{name}", "shape": name})
    assert sizing["kv_cache"]["num_blocks"] > 0 and sizing["note"] == f"shape from named shape {name}"



@pytest.mark.parametrize(("option", "value"), [("kv_cache_dtype", "int8"), ("quantization", "int4")])
def test_a_precision_the_engine_refuses_is_refused_by_the_stack_with_the_same_message(tmp_path, capsys, option,
                                                                                       value):
    engine = _error(["generate", "--model", "qwen3-0.6b", "--prompt", "hi", f"--{option.replace('_', '-')}", value],
                    capsys)
    model = {"model": "/models/qwen3-0.6b", "shape": "qwen3-0.6b", "engine": {option: value}}
    plan = _error(["plan", "--nodes", str(NODES), "-c", _stack(tmp_path, model)], capsys)
    assert f"models.0.engine.{option}" in plan and plan.endswith(engine)


def test_plan_sizes_fp8_weights_and_an_fp8_kv_cache_as_the_engine_stores_them(tmp_path, capsys):
    model = {"model": "/models/qwen2-7b", "shape": "qwen2-7b"}
    bf16 = _plan_sizing(tmp_path, capsys, model)["kv_cache"]
    fp8_engine = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    fp8 = _plan_sizing(tmp_path, capsys, {**model, "engine": fp8_engine})["kv_cache"]
    spec = ModelSpec.from_hf_config(shape_config("qwen2-7b"))
    assert fp8["weights_bytes"] == spec.with_precision(quantization="fp8").weight_bytes()
    assert fp8["weights_bytes"] < 0.6 * bf16["weights_bytes"]
    assert fp8["bytes_per_block"] * 2 == bf16["bytes_per_block"]
    assert fp8["num_blocks"] > 2 * bf16["num_blocks"]  # half the bytes per block, and more memory left for them
