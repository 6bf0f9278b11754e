"""`railyard serve` reports where its start-up went: once on stdout, and as railyard:startup_phase_seconds on
/metrics; the phases are the ones a start goes through, none negative, and they add up to no more than the
wall time this test measures from starting the process to its first /health 200 (the engine process's last phase
freezes its start-up heap). Weight loading's parts
(railyard:startup_weight_loading_seconds) add up to its phase, and the front's tokenizer load is counted."""

from __future__ import annotations

import os
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from railyard.bench.startup import ServerProcess

pytestmark = pytest.mark.slow  # starts `railyard serve` processes

PHASES = {"front_imports", "engine_spawn", "imports", "model_construction", "weight_loading", "kv_profile",
          "kv_allocation", "cuda_graphs", "heap_freeze", "front_tokenizer", "server_start"}


@pytest.fixture(scope="module")
def started(tiny_model, tmp_path_factory):
    """(wall seconds to the first /health 200, the /metrics samples, the server's output lines)"""
    return serve_until_healthy([sys.executable], tiny_model, tmp_path_factory.mktemp("cache"))


def serve_until_healthy(launcher: list[str], tiny_model, cache_dir) -> tuple[float, list, list[str]]:
    """Start `railyard serve` on the tiny model through `launcher` (the clock starts as the process is started),
    wait for its first /health 200, scrape /metrics, stop it: (wall seconds, the samples, its output lines)."""
    server = ServerProcess(
        [*launcher, "-m", "railyard.cli", "serve", "--model", tiny_model, "--max-model-len", "128",
         "--num-gpu-blocks", "64"],
        env={**os.environ, "RAILYARD_API_KEY": "", "RAILYARD_CACHE": str(cache_dir)})
    try:
        with httpx.Client(timeout=5.0) as client:
            wall = server.wait_healthy(client, timeout_s=180)
            metrics = client.get(f"{server.url}/metrics").text
    finally:
        server.stop()
    samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]
    return wall, samples, server.lines


def test_start_up_phases_add_up_to_at_most_the_wall_time_to_health(started):
    wall, samples, lines = started
    phases = {s.labels["phase"]: s.value for s in samples if s.name == "railyard:startup_phase_seconds"}
    assert PHASES <= set(phases), phases
    assert all(seconds >= 0.0 for seconds in phases.values()), phases
    # The server dates its start from when railyard started, after the process did.
    assert sum(phases.values()) <= wall, (phases, wall)
    assert any(line.startswith("railyard serve: start-up: total ") for line in lines), lines


def test_weight_loading_parts_add_up_to_its_phase_and_the_tokenizer_thread_is_counted(started):
    _, samples, _ = started
    phase = next(s.value for s in samples
                 if s.name == "railyard:startup_phase_seconds" and s.labels["phase"] == "weight_loading")
    parts = {s.labels["part"]: s for s in samples if s.name == "railyard:startup_weight_loading_seconds"}
    assert set(parts) == {"read", "to_device", "copy", "other"}
    assert {s.labels["reader"] for s in parts.values()} == {"mapped"}
    assert sum(s.value for s in parts.values()) == pytest.approx(phase, abs=1e-6)
    tokenizer = [s.value for s in samples
                 if s.name == "railyard:startup_background_seconds" and s.labels["task"] == "tokenizer"]
    assert tokenizer and tokenizer[0] > 0.0


def test_the_start_up_clock_starts_with_railyard_not_with_what_its_process_ran_before(tiny_model, tmp_path):
    # `sh -c 'pip install ... && exec railyard serve'`: the process began DELAY_S before railyard did.
    delay_s = 2.0
    wall, samples, _ = serve_until_healthy(["sh", "-c", f'sleep {delay_s}; exec "$0" "$@"', sys.executable],
                                           tiny_model, tmp_path / "cache")
    total = next(s.value for s in samples if s.name == "railyard:startup_seconds")
    assert 0.0 < total <= wall - delay_s, (total, wall)  # the sleep lasted at least delay_s, whatever the load
