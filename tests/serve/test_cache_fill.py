"""`railyard cache fill --config stack.yaml` starts each distinct engine of a stack once, here, and stops it: what
its start-up compiles (on a GPU, every kernel; anywhere, the tokenizers) lands in $RAILYARD_CACHE, where the
stack's replicas look. Oracle: the stack's own deployments, and the cache directory after the fill."""

from __future__ import annotations

import json

import pytest
import yaml

from railyard.cli import main
from railyard.serve.cache_fill import engine_groups, fill
from railyard.stack import parse_stack


def _stack(model_dir: str) -> dict:
    return {"image": "railyard:test", "models": [
        {"name": "tiny", "model": model_dir, "engine": {"max_num_seqs": 4, "max_model_len": 128},
         "pools": [{"name": "short", "max_prompt_tokens": 64}, {"name": "long"}]},
        {"name": "other", "model": model_dir, "engine": {"max_num_seqs": 8, "max_model_len": 128}}]}


def test_deployments_with_the_same_engine_are_filled_once(tiny_model):
    groups = engine_groups(parse_stack(_stack(tiny_model)))
    assert [names for _, names in groups] == [["engine-tiny-short", "engine-tiny-long"], ["engine-other-default"]]
    assert [engine["max_num_seqs"] for engine, _ in groups] == [4, 8]


def test_a_fill_starts_each_engine_and_leaves_what_it_loaded_in_the_cache(tiny_model, monkeypatch, tmp_path):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    filled = fill(parse_stack(_stack(tiny_model)), models=["tiny"], device="cpu")
    assert [f.deployments for f in filled] == [["engine-tiny-short", "engine-tiny-long"]]
    assert filled[0].kernel_cache is None  # the CPU JITs no kernel
    assert any((tmp_path / "tokenizers").iterdir())  # the grammars' tokenizer, pickled for the next start


def test_the_command_prints_one_json_line_per_engine(tiny_model, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    (tmp_path / "stack.yaml").write_text(yaml.safe_dump(_stack(tiny_model)))
    assert main(["cache", "fill", "--config", str(tmp_path / "stack.yaml"), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["deployments"] for line in lines[:-1]] == [["engine-tiny-short", "engine-tiny-long"],
                                                                        ["engine-other-default"]]
    assert str(tmp_path / "cache") in lines[-1]


def test_a_model_the_stack_lacks_is_one_line_and_exit_2(tiny_model, tmp_path, capsys):
    (tmp_path / "stack.yaml").write_text(yaml.safe_dump(_stack(tiny_model)))
    assert main(["cache", "fill", "--config", str(tmp_path / "stack.yaml"), "--model", "nope"]) == 2
    assert "no such model" in capsys.readouterr().err
