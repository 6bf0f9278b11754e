"""`railyard bench throughput --num-loras N --lora-rank R`: the same workload on the base model and spread over N
random adapters written for the model's shape, in one call; both runs' rates, TTFT and TPOT, and their ratio."""

from __future__ import annotations

import dataclasses
import json

from railyard.bench.lora import write_random_adapters
from railyard.cli import main
from railyard.engine.lora.peft import inspect_adapter
from railyard.model.spec import ModelSpec, read_model_spec
from railyard.shapes import shape_config


def test_random_adapters_for_a_named_shape_are_valid_peft_adapters_of_that_model(tmp_path):
    spec = dataclasses.replace(ModelSpec.from_hf_config(shape_config("qwen2-7b")), num_layers=2)  # enough layers
    loras = write_random_adapters(spec, tmp_path, num=2, rank=16)
    assert [r.lora_int_id for r in loras] == [1, 2]
    adapter = inspect_adapter(loras[1], spec, max_rank=16)
    assert adapter.max_rank == 16 and len(adapter.ranks) == 2 * 7


def test_bench_throughput_with_loras_reports_the_base_and_the_adapter_runs(tiny_model, capsys):
    rc = main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "6", "--input-len", "8-20",
               "--output-len", "5", "--warmup-prompts", "0", "--num-loras", "3", "--lora-rank", "8",
               "--max-model-len", "128"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_loras"] == 3 and report["lora_rank"] == 8
    for run in ("base", "lora"):
        assert report[run]["output_tokens"] == 6 * 5
        assert report[run]["ttft_ms"]["p50"] > 0 and report[run]["tpot_ms"]["p50"] > 0
    ratio = report["lora"]["output_tokens_per_s"] / report["base"]["output_tokens_per_s"]
    assert report["lora_over_base_output_tokens_per_s"] == round(ratio, 4)


def test_random_adapters_may_target_some_modules_only(tiny_model, tmp_path):
    spec = read_model_spec(tiny_model)
    loras = write_random_adapters(spec, tmp_path, num=1, rank=4, modules=("q_proj", "down_proj"))
    assert inspect_adapter(loras[0], spec, max_rank=4).modules == ["q_proj", "down_proj"]
