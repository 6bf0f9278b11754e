"""/health tells probes the truth: 503 once the engine loop has died, and requests get 503, not a hang."""

from __future__ import annotations

import httpx

from tests.api.conftest import serve_in_thread, tiny_engine


def test_health_and_requests_answer_503_after_the_engine_died(tiny_model):
    engine = tiny_engine(tiny_model)
    with serve_in_thread(engine) as server:
        assert httpx.get(server.url + "/health").status_code == 200

        def broken_step():
            raise RuntimeError("device lost")

        engine.engine.step = broken_step  # what a failed kernel or a lost GPU looks like to the loop
        body = {"model": server.model, "prompt": "hi", "max_tokens": 2}
        first = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert first.status_code == 503 and "device lost" in first.json()["error"]["message"]
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 503
