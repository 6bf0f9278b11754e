"""`railyard bench throughput` runs the seeded offline workload and prints the JSON fields."""

from __future__ import annotations

import json

from railyard.cli import main


def test_bench_throughput_prints_json_with_token_rates(tiny_model, capsys):
    rc = main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "12", "--input-len", "8-40",
               "--output-len", "6", "--max-num-seqs", "4"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 12
    assert result["output_tokens"] == 12 * 6
    assert 12 * 8 <= result["prompt_tokens"] <= 12 * 40
    assert result["output_tokens_per_s"] > 0 and result["total_tokens_per_s"] > result["output_tokens_per_s"]
    assert result["elapsed_s"] > 0


def test_bench_throughput_rejects_a_bad_length_range(tiny_model, capsys):
    rc = main(["bench", "throughput", "--model", tiny_model, "--input-len", "50-10"])
    assert rc == 2
    assert "LOW <= HIGH" in capsys.readouterr().err
