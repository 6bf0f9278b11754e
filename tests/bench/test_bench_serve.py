"""`railyard bench serve`, run as users run it (the CLI in its own process), against a real uvicorn server."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.api.conftest import serve_in_thread, tiny_engine
from tests.bench.conftest import run_bench

pytestmark = pytest.mark.slow  # runs the bench CLI in its own processes against a server


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_bench("serve", *args)


def test_bench_serve_reports_latency_percentiles_and_throughput(server, tmp_path):
    plot = tmp_path / "latency.png"
    run = bench("--url", server.url, "--model", server.model, "--num-prompts", "40", "--input-len", "8-32",
                "--output-len", "4-12", "--request-rate", "40", "--max-concurrency", "16", "--plot", str(plot))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["completed"], result["failed"]) == (40, 0)
    assert 40 * 8 <= result["total_input_tokens"] <= 40 * 32
    assert 40 * 4 <= result["total_output_tokens"] <= 40 * 12
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        stats = result[key]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], key
    assert result["e2el_ms"]["p50"] >= result["ttft_ms"]["p50"]
    assert result["request_throughput"] > 0 and result["output_token_throughput"] > 0
    assert "TTFT p99 (ms)" in run.stderr  # the human-readable table
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps = result["server_steps"]  # what the server's engine steps carried, from its /metrics
    assert steps["steps"] > 0 and steps["decode_rows_per_step"] > 0 and steps["prefill_tokens_per_step"] > 0
    # Every output token but each request's first comes from a decode row (rows per step are rounded to 0.01).
    assert (steps["decode_rows_per_step"] + 0.005) * steps["steps"] >= result["total_output_tokens"] - 40 - 1
    # Each request's prompt went through at least one step that carried prefill, and not every step did.
    assert 0 < steps["prefill_step_fraction"] < 1


def test_bench_serve_counts_failures_instead_of_crashing(server):
    run = bench("--url", server.url, "--model", "not-served", "--num-prompts", "3", "--input-len", "4",
                "--output-len", "2", "--max-concurrency", "2")
    result = json.loads(run.stdout)
    assert (result["completed"], result["failed"]) == (0, 3)
    assert "HTTP 404" in result["errors"][0]
    assert run.returncode == 1


def test_bench_serve_rejects_a_bad_length_with_exit_2(server):
    run = bench("--url", server.url, "--model", server.model, "--input-len", "10-5")
    assert run.returncode == 2 and "LOW <= HIGH" in run.stderr


def test_bench_serve_constrains_every_request_and_can_make_each_schema_first_seen(tiny_model):
    schema = {"type": "object", "properties": {"xs": {"type": "array", "minItems": 50,
                                                      "items": {"enum": ["ab", "cd"]}}}, "required": ["xs"]}
    with serve_in_thread(tiny_engine(tiny_model, engine_process=False)) as server:  # its core is in reach
        structured = server.engine.core.structured
        for unique, new_compiles in ((False, 1), (True, 6)):
            before = structured._compiler.num_compiled if structured._compiler else 0
            run = bench("--url", server.url, "--model", server.model, "--num-prompts", "6", "--input-len", "8",
                        "--output-len", "10", "--max-concurrency", "3", "--structured-outputs",
                        json.dumps({"json": schema}), *(["--unique-schemas"] if unique else []))
            result = json.loads(run.stdout)
            assert (result["completed"], result["failed"]) == (6, 0), result["errors"]
            assert result["structured_outputs"] == ["json"] and result["unique_schemas"] is unique
            assert structured._compiler.num_compiled - before == new_compiles


def test_bench_serve_refuses_unique_schemas_without_a_schema(server):
    run = bench("--url", server.url, "--model", server.model, "--structured-outputs", '{"regex": "a+"}',
                "--unique-schemas")
    assert run.returncode == 2 and "--unique-schemas" in run.stderr


def test_a_wrong_model_name_ends_with_the_servers_404_message_as_an_error_line(server):
    run = bench("--url", server.url, "--model", "not-served", "--num-prompts", "2", "--input-len", "4",
                "--output-len", "2")
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("railyard bench serve: error: all 2 requests failed; HTTP 404: ") and "not-served" in last
    assert "None" not in run.stderr  # the table leaves out what a run without completed requests has not


def test_a_second_run_with_the_same_seed_is_reported_as_served_from_the_prefix_cache(server):
    args = ("--url", server.url, "--model", server.model, "--num-prompts", "8", "--input-len", "64",
            "--output-len", "2", "--max-concurrency", "4")
    first = json.loads(bench(*args, "--seed", "11").stdout)
    again = bench(*args, "--seed", "11")
    other = json.loads(bench(*args, "--seed", "12").stdout)
    repeated = json.loads(again.stdout)
    assert repeated["prefix_cache_hit_rate"] > 0.5 > first["prefix_cache_hit_rate"]
    assert other["prefix_cache_hit_rate"] < 0.5 and other["warnings"] == []  # a new seed: new prompts
    assert repeated["warnings"] and "railyard bench serve: warning: " in again.stderr and "own seed" in again.stderr
    assert "server prefix-cache hit rate" in again.stderr
