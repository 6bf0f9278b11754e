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


def test_bench_throughput_json_carries_the_engines_start_up_memory_report(tiny_model, capsys):
    assert main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "2", "--output-len", "2",
                 "--max-num-seqs", "2", "--warmup-prompts", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    memory = report["memory"]
    assert memory["weights_bytes"] > 0 and memory["block_bytes"] > 0
    assert memory["num_blocks"] == memory["kv_cache_bytes"] // memory["block_bytes"]
    assert memory["num_blocks"] == report["num_kv_blocks"]  # the report's blocks are the engine's
    assert report["warnings"] == []  # fresh prompts: no prefix-cache reuse to warn of


def test_bench_throughput_rejects_a_bad_length_range(tiny_model, capsys):
    rc = main(["bench", "throughput", "--model", tiny_model, "--input-len", "50-10"])
    assert rc == 2
    assert "LOW <= HIGH" in capsys.readouterr().err


def test_warmup_prompts_run_first_and_are_not_counted(tiny_model, capsys):
    from railyard.bench.throughput import run_throughput
    from railyard.bench.workload import LengthRange
    from railyard.engine.config import EngineConfig
    from railyard.engine.engine import Engine

    engine = Engine(EngineConfig(model=tiny_model, device="cpu"))
    result = run_throughput(engine, 6, LengthRange(40, 60), LengthRange(5, 5), seed=3, warmup_prompts=4)
    stats = engine.stats()
    assert result.warmup_prompts == 4 and result.output_tokens == 6 * 5
    assert stats.num_requests_finished_total == 10  # 4 warm-up + 6 measured
    assert stats.generation_tokens_total == 4 * 4 + 6 * 5
    assert result.prefix_cache_hit_rate < 0.5  # the warm-up prompts are other prompts


def test_bench_throughput_rejects_negative_warmup(tiny_model, capsys):
    rc = main(["bench", "throughput", "--model", tiny_model, "--warmup-prompts", "-1"])
    assert rc == 2
    assert "--warmup-prompts" in capsys.readouterr().err


def test_bench_throughput_roofline_counts_fp8_weights_and_kv_cache(tiny_model, capsys):
    args = ["bench", "throughput", "--model", tiny_model, "--num-prompts", "4", "--input-len", "8-40",
            "--output-len", "4", "--warmup-prompts", "0", "--peak-tflops", "790", "--hbm-tbs", "4.3"]  # CPU: given
    assert main(args) == 0
    bf16 = json.loads(capsys.readouterr().out)["roofline"]
    assert main(args + ["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--fp8-peak-tflops", "1500"]) == 0
    fp8 = json.loads(capsys.readouterr().out)["roofline"]
    assert bf16["fp8_peak_tflops"] is None and fp8["fp8_peak_tflops"] == 1500


def test_roofline_spec_takes_its_bytes_from_the_engine(tiny_model):
    from railyard.bench.cli import roofline_spec
    from railyard.engine.config import EngineConfig
    from railyard.engine.engine import Engine

    plain = roofline_spec(Engine(EngineConfig(model=tiny_model, device="cpu")))
    fp8 = roofline_spec(Engine(EngineConfig(model=tiny_model, device="cpu", quantization="fp8",
                                            kv_cache_dtype="fp8")))
    assert (plain.dtype_bytes, plain.linear_weight_bytes, plain.kv_element_bytes) == (4, 4, 4)  # float32 on CPU
    assert (fp8.dtype_bytes, fp8.linear_weight_bytes, fp8.kv_element_bytes) == (4, 1, 1)


def test_token_id_range_gives_the_very_requests_bench_serve_sends(tiny_model):
    from railyard.bench.serve import ServeBenchConfig
    from railyard.bench.throughput import workload_requests
    from railyard.bench.workload import LengthRange, synthetic_requests
    from railyard.engine.config import EngineConfig
    from railyard.engine.engine import Engine

    cfg = ServeBenchConfig(url="", model="", num_prompts=20, input_len=LengthRange(10, 90),
                           output_len=LengthRange(8, 8), seed=3)
    served = synthetic_requests(cfg.num_prompts, cfg.input_len, cfg.output_len, cfg.token_id_range, cfg.seed)
    engine = Engine(EngineConfig(model=tiny_model, max_model_len=128))
    offline = workload_requests(engine, 20, LengthRange(10, 90), LengthRange(8, 8), 3, cfg.token_id_range)
    assert offline == served


def test_runs_repeat_the_workload_in_one_engine_with_prompts_of_their_own(tiny_model, capsys):
    assert main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "4", "--input-len", "20-40",
                 "--output-len", "3", "--runs", "3", "--warmup-prompts", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    runs = report["runs"]
    assert len(runs) == 3 and report["elapsed_s"] == runs[0]["elapsed_s"]
    assert {r["prompt_tokens"] for r in runs} == {report["prompt_tokens"]}  # the same lengths each run
    assert all(r["prefix_cache_hit_rate"] == 0.0 for r in runs)  # other token ids: nothing cached from before
    assert report["first_over_last"] == round(runs[0]["output_tokens_per_s"] / runs[2]["output_tokens_per_s"], 4)
    assert report["jit_after_ready"] == 0  # the CPU compiles nothing
    assert report["longest_token_gap_ms"] == [r["longest_token_gap_ms"] for r in runs]


def test_a_step_stalled_in_the_first_run_shows_as_its_longest_token_gap(tiny_model, capsys, monkeypatch):
    """What the first workload after ready is held to (no first-use work on the step loop): a stall between two of a
    stream's tokens is the run's longest gap; the later runs, without one, are the control."""
    import time

    from railyard.engine.engine import Engine

    step, calls = Engine.step, []

    def step_with_one_stall(self):
        calls.append(None)
        if len(calls) == 4:  # the first run's requests each have a token by now (4 prompts, budget for all)
            time.sleep(1.0)
        return step(self)

    monkeypatch.setattr(Engine, "step", step_with_one_stall)
    assert main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "4", "--input-len", "20-40",
                 "--output-len", "8", "--runs", "3", "--warmup-prompts", "0"]) == 0
    first, *later = json.loads(capsys.readouterr().out)["longest_token_gap_ms"]
    assert first >= 1000 and all(gap < first for gap in later)


def test_bench_throughput_rejects_zero_runs(tiny_model, capsys):
    assert main(["bench", "throughput", "--model", tiny_model, "--runs", "0"]) == 2
    assert "--runs" in capsys.readouterr().err
