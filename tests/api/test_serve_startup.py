"""`railyard serve` reports where its start-up went: once on stdout, and as railyard:startup_phase_seconds on
/metrics; the phases are the ones a start goes through, none negative, and they add up to no more than the
wall time this test measures from starting the process to its first /health 200."""

from __future__ import annotations

import os
import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from railyard.bench.startup import ServerProcess

PHASES = {"front_imports", "engine_spawn", "imports", "model_construction", "weight_loading", "kv_profile",
          "kv_allocation", "cuda_graphs", "front_tokenizer", "server_start"}


def test_start_up_phases_add_up_to_at_most_the_wall_time_to_health(tiny_model, tmp_path):
    server = ServerProcess(  # the clock starts as the process is started
        [sys.executable, "-m", "railyard.cli", "serve", "--model", tiny_model, "--max-model-len", "128",
         "--num-gpu-blocks", "64"], env={**os.environ, "RAILYARD_API_KEY": "", "RAILYARD_CACHE": str(tmp_path)})
    try:
        with httpx.Client(timeout=5.0) as client:
            wall = server.wait_healthy(client, timeout_s=180)
            metrics = client.get(f"{server.url}/metrics").text
    finally:
        server.stop()
    phases = {s.labels["phase"]: s.value for f in text_string_to_metric_families(metrics)
              for s in f.samples if s.name == "railyard:startup_phase_seconds"}
    assert PHASES <= set(phases), phases
    assert all(seconds >= 0.0 for seconds in phases.values()), phases
    assert sum(phases.values()) <= wall, (phases, wall)
    assert any(line.startswith("railyard serve: start-up: total ") for line in server.lines), server.lines
