"""/health tells probes the truth: 503 once the engine process has died (the front watches the process's sentinel on
its event loop, so no request has to fail first), and requests get 503, not a hang; /metrics says so too."""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.api.conftest import serve_in_thread, tiny_engine


def test_health_and_requests_answer_503_after_the_engine_process_is_killed(tiny_model):
    engine = tiny_engine(tiny_model)
    with serve_in_thread(engine) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        assert "railyard:engine_healthy" in httpx.get(server.url + "/metrics").text
        os.kill(engine.pid, signal.SIGKILL)  # what an OOM kill or a crashed driver looks like to the front
        killed = time.monotonic()
        while httpx.get(server.url + "/health", timeout=5).status_code == 200:
            # a liveness bound only: the sentinel fires at once, but a loaded machine may be slow to schedule us
            assert time.monotonic() - killed < 30.0, "/health still says ok 30 s after the engine died"
            time.sleep(0.05)
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "died" in health.json()["error"]["message"]
        body = {"model": server.model, "prompt": "hi", "max_tokens": 2}
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable_error"
        metrics = httpx.get(server.url + "/metrics").text
        assert 'railyard:engine_healthy{engine="0",model_name="tiny"} 0.0' in metrics
        assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in metrics
    assert engine.process.exitcode is not None


def test_an_in_process_engine_whose_loop_dies_answers_503_too(tiny_model):
    engine = tiny_engine(tiny_model, engine_process=False)
    with serve_in_thread(engine) as server:
        assert httpx.get(server.url + "/health").status_code == 200

        def broken_step():
            raise RuntimeError("device lost")

        engine.core.step = broken_step  # what a failed kernel or a lost GPU looks like to the loop
        body = {"model": server.model, "prompt": "hi", "max_tokens": 2}
        first = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert first.status_code == 503 and "device lost" in first.json()["error"]["message"]
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 503
