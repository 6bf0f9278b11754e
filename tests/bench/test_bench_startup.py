"""`railyard bench startup`: starts `railyard serve` on a checkpoint, first with an empty railyard cache and then
warm, and reports each start's wall time to /health and the server's own phases; it writes a random-weight
checkpoint that HF transformers loads, and refuses what would make its first run not cold."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from railyard.bench.checkpoint import write_random_checkpoint
from railyard.cli import main
from railyard.engine.startup.tiny_model import tiny_config

pytestmark = pytest.mark.slow  # starts `railyard serve` several times

CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def test_runs_are_cold_then_warm_and_each_reports_its_phases_within_its_wall_time(tiny_model, capsys):
    assert main(["bench", "startup", "--checkpoint-dir", tiny_model, "--runs", "2",
                 "--serve-args", "--max-model-len 128 --num-gpu-blocks 64"]) == 0
    report = json.loads(capsys.readouterr().out)
    tensors = load_file(str(Path(tiny_model) / "model.safetensors"))
    assert [r["cache"] for r in report["runs"]] == ["cold", "warm"]
    assert report["pre_read"]["bytes"] == report["checkpoint_bytes"] > 0
    assert report["sync_s"] >= 0  # dirty pages (a checkpoint just written) written back before the first start
    for run in report["runs"]:
        # The server dates its start from /proc (clock ticks, 10 ms on Linux), so its total may read up to one
        # tick (+ rounding) longer than the bench's own clock from the spawn.
        assert 0 < run["total_s"] <= run["wall_s"] + CLOCK_TICK_S + 0.001
        assert {"weight_loading", "kv_profile", "cuda_graphs", "server_start"} <= set(run["phases_s"])
        assert run["weight_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
        assert run["page_cache_resident"] == 1.0  # read through before the first run
        assert run["weights_reader"] == "mapped" and set(run["weight_parts_s"]) == {"read", "to_device", "copy", "other"}
        assert sum(run["weight_parts_s"].values()) == pytest.approx(run["phases_s"]["weight_loading"], abs=0.005)
        assert run["background_s"]["tokenizer"] > 0


def test_written_random_checkpoint_loads_in_hf_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    config = tiny_config("qwen2", torch_dtype="bfloat16")
    written = write_random_checkpoint(config, tmp_path / "ckpt", seed=1, shard_bytes=50_000, device="cpu")
    assert written.files > 1 and (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert written.bytes == params and model.model.norm.weight.eq(1).all()


def test_a_directory_without_a_checkpoint_needs_a_shape(tmp_path, capsys):
    assert main(["bench", "startup", "--checkpoint-dir", str(tmp_path / "none")]) == 2
    assert "give --model SHAPE" in capsys.readouterr().err


def test_a_cache_dir_that_is_not_empty_is_refused(tiny_model, tmp_path, capsys):
    (tmp_path / "triton").mkdir()
    assert main(["bench", "startup", "--checkpoint-dir", tiny_model, "--cache-dir", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_each_start_meets_only_its_own_roots_caches(monkeypatch, tmp_path):
    """The bench's own bytecode prefix (under its root) and a TRITON_CACHE_DIR would make a cold start warm; a
    prefix the user chose stays, as it would in production."""
    from railyard.bench.startup import serve_env
    from railyard.engine.startup.caches import BYTECODE

    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path / "bench-root"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "bench-root" / BYTECODE))
    env = serve_env(tmp_path / "run-root")
    assert env["RAILYARD_CACHE"] == str(tmp_path / "run-root")
    assert "TRITON_CACHE_DIR" not in env and "PYTHONPYCACHEPREFIX" not in env
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "mine"))
    assert serve_env(tmp_path / "run-root")["PYTHONPYCACHEPREFIX"] == str(tmp_path / "mine")
