"""`railyard bench burst`, run as users run it (the CLI in its own process), against a real `railyard serve`
(uvicorn, the OpenAI app, an engine-core process on the tiny model)."""

from __future__ import annotations

import json
import subprocess

import pytest

from railyard.bench.burst import (
    _FLEET_SAMPLES, REPLICA_TPOT_METRIC, REPLICAS_SERVING_METRIC, BurstTrace, Sample, _fleet_metrics, new_replica_tpot,
    replica_seconds)
from railyard.errors import ConfigError
from tests.bench.conftest import run_bench

pytestmark = pytest.mark.slow  # runs the bench CLI in its own processes against a server

TRACE = ["--rate", "4", "--burst-factor", "5", "--steady-s", "2", "--burst-s", "2", "--after-s", "2"]


def burst(*args: str) -> subprocess.CompletedProcess:
    return run_bench("burst", *args)


def test_the_trace_steps_to_n_times_the_rate_for_the_burst_and_back():
    trace = BurstTrace(rate=10, burst_factor=4, steady_s=100, burst_s=100, after_s=100)
    arrivals = trace.arrivals(seed=0)
    counts = {phase: sum(trace.phase(t) == phase for t in arrivals) for phase in ("before", "burst", "after")}
    # Poisson counts: mean rate x 100 s, standard deviation its square root (1000 +- 32, 4000 +- 63).
    assert 900 < counts["before"] < 1100 and 900 < counts["after"] < 1100
    assert 3800 < counts["burst"] < 4200
    assert arrivals == sorted(arrivals) and arrivals == trace.arrivals(seed=0)


def test_a_trace_without_a_positive_rate_or_burst_is_refused():
    with pytest.raises(ConfigError, match="--rate"):
        BurstTrace(rate=0, burst_factor=2, steady_s=1, burst_s=1, after_s=1)
    with pytest.raises(ConfigError, match="--burst-factor"):
        BurstTrace(rate=1, burst_factor=0.5, steady_s=1, burst_s=1, after_s=1)


def test_replica_seconds_integrate_running_replicas_over_the_samples():
    samples = [Sample(0.0, 0, 1), Sample(2.0, 5, 3), Sample(3.0, 0, 1), Sample(4.0, 0, 1)]
    assert replica_seconds(samples) == 1 * 2 + 3 * 1 + 1 * 1


def test_bench_burst_records_each_second_and_writes_a_timeline_png(server, tmp_path):
    plot, output = tmp_path / "burst.png", tmp_path / "burst.json"
    # 64 output tokens: long enough that requests are in flight at the once-a-second samples (with 4 they often
    # all finished between two samples, and the in-flight column read 0 throughout)
    run = burst("--url", server.url, "--model", server.model, *TRACE, "--input-len", "8-16", "--output-len", "64",
                "--plot", str(plot), "--output", str(output))
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["failed"] == 0 and report["completed"] == report["requests"] > 0
    phases = report["phases"]
    assert sum(p["requests"] for p in phases.values()) == report["requests"]
    assert phases["burst"]["requests"] > phases["before"]["requests"]  # 20 req/s against 4 (both over 2 s)
    rows = report["timeline"]
    assert [r["t"] for r in rows] == list(range(len(rows))) and len(rows) >= 6
    assert [r["phase"] for r in rows[:6]] == ["before"] * 2 + ["burst"] * 2 + ["after"] * 2
    assert sum(r["arrivals"] for r in rows) == report["requests"]
    assert any(r["in_flight"] > 0 for r in rows)
    for r in rows:
        if r["arrivals"]:
            assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
    # No Ray Serve app named, and a server whose /metrics has no replica counts: the fleet is not known.
    assert all(r["replicas"] is None and r["replicas_serving"] is None for r in rows)
    assert report["fleet"]["replica_seconds"] is None
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(json.loads(output.read_text())["requests"]) == report["requests"]
    assert "TTFT p99 ms" in run.stderr


def test_bench_burst_counts_failures_per_second(server):
    run = burst("--url", server.url, "--model", "not-served", "--rate", "5", "--steady-s", "0", "--burst-s", "1",
                "--after-s", "0", "--burst-factor", "1", "--input-len", "4", "--output-len", "2")
    report = json.loads(run.stdout)
    assert run.returncode == 1 and report["completed"] == 0 and report["failed"] == report["requests"] > 0
    assert list(report["error_counts"]) == ["HTTP 404"]
    assert sum(r["failed"] for r in report["timeline"]) == report["failed"]


def test_bench_burst_rejects_an_app_without_its_deployment_with_exit_2(server):
    run = burst("--url", server.url, "--model", server.model, "--app", "railyard")
    assert run.returncode == 2 and "--deployment" in run.stderr


def tpot_sample(t: float, **replicas: tuple[float, float]) -> Sample:
    return Sample(t, 0, len(replicas), None, dict(replicas))


def test_a_new_replicas_first_requests_are_timed_against_the_warm_replicas_over_the_same_seconds():
    samples = [tpot_sample(0.0, warm=(0.2, 10)), tpot_sample(5.0, warm=(0.4, 20)),  # the burst starts at 5 s
               tpot_sample(9.0, warm=(0.6, 30), new=(0.0, 0)),  # the new replica runs; nothing finished yet
               tpot_sample(10.0, warm=(0.7, 35), new=(0.05, 2)),  # its first two requests
               tpot_sample(15.0, warm=(1.2, 55), new=(0.35, 12)),
               tpot_sample(20.0, warm=(1.6, 75), new=(0.55, 20)),  # 10 s after its first: the window's end
               tpot_sample(30.0, warm=(3.0, 100), new=(2.0, 50))]
    report = new_replica_tpot(samples, start=5.0)
    assert report["replica"] == "new" and report["window_s"] == [4.0, 15.0]
    assert report["new"] == {"requests": 20, "tpot_ms": 27.5}  # 0.55 s over 20 requests, from 9 s to 20 s
    assert report["warm"] == {"requests": 45, "tpot_ms": 22.222}  # (1.6 - 0.6) s over 45 requests
    assert report["speed_vs_warm"] == round(22.222 / 27.5, 4)


def test_no_new_replica_or_no_per_replica_counts_give_no_tpot_comparison():
    assert new_replica_tpot([Sample(0.0, 0), Sample(9.0, 0)], start=5.0) is None
    assert new_replica_tpot([tpot_sample(0.0, warm=(0.1, 5)), tpot_sample(9.0, warm=(0.5, 25))], start=5.0) is None


def test_counts_that_fall_between_samples_name_several_ingress_replicas_instead_of_figures():
    samples = [tpot_sample(0.0, a=(0.4, 20)), tpot_sample(6.0, a=(0.1, 5), b=(0.1, 3)), tpot_sample(7.0, a=(0.5, 21))]
    assert "one ingress replica" in new_replica_tpot(samples, start=5.0)["note"]


def test_fleet_metrics_read_replicas_serving_and_each_replicas_tpot_sum_and_count():
    from prometheus_client.parser import text_string_to_metric_families

    page = (f"# TYPE {REPLICAS_SERVING_METRIC[:-6]} counter\n{REPLICAS_SERVING_METRIC}{{model=\"m\"}} 2.0\n"
            f"# TYPE {REPLICA_TPOT_METRIC} summary\n"
            f"{REPLICA_TPOT_METRIC}_count{{model=\"m\",replica=\"r1\"}} 4.0\n"
            f"{REPLICA_TPOT_METRIC}_sum{{model=\"m\",replica=\"r1\"}} 0.08\n"
            f"{REPLICA_TPOT_METRIC}_count{{model=\"m\",replica=\"r2\"}} 1.0\n"
            f"{REPLICA_TPOT_METRIC}_sum{{model=\"m\",replica=\"r2\"}} 0.03\n")
    found = [s for f in text_string_to_metric_families(page) for s in f.samples if s.name in _FLEET_SAMPLES]
    assert _fleet_metrics(found) == (2.0, {"r1": (0.08, 4.0), "r2": (0.03, 1.0)})
    assert _fleet_metrics([]) == (None, {})
