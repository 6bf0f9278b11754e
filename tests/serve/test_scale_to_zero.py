"""Scale to zero and back on real Ray Serve, through its HTTP proxy: with `min_replicas: 0` and railyard's
pending-requests policy the engine deployment starts with no replica and returns to none when idle, and the
first request after idle waits for a replica to start and then succeeds (a 200 with every token, not a 5xx)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from railyard.bench.burst import REPLICA_TPOT_METRIC, REPLICAS_SERVING_METRIC, ServeReplicas
from railyard.serve.app import build_app
from tests.serve.conftest import engine_args, running_replicas, wait_until

pytestmark = pytest.mark.timeout(300)

APP, PREFIX, DEPLOYMENT = "zero", "/zero", "engine-tiny-default"
AUTOSCALING = {"min_replicas": 0, "max_replicas": 1, "target_pending_per_replica": 2, "upscale_delay_s": 1.0,
               "downscale_delay_s": 2.0, "metrics_interval_s": 0.5, "look_back_period_s": 1.0}


def completion(url: str) -> tuple[httpx.Response, float]:
    """One greedy completion through the proxy, and how long it took."""
    start = time.perf_counter()
    resp = httpx.post(f"{url}{PREFIX}/v1/completions", timeout=120,
                      json={"model": "tiny", "prompt": [5, 17, 42, 99], "max_tokens": 8, "temperature": 0,
                            "ignore_eos": True})
    return resp, time.perf_counter() - start


def metric_samples(url: str, name: str) -> list:
    text = httpx.get(f"{url}{PREFIX}/metrics", timeout=30).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name]


def replicas_serving(url: str) -> float:
    """The ingress's count of engine replicas that have served a request, from its /metrics."""
    return sum(sample.value for sample in metric_samples(url, REPLICAS_SERVING_METRIC))


def test_min_replicas_zero_idles_at_none_and_the_first_request_after_idle_waits_and_succeeds(serve_cluster,
                                                                                          tiny_model_dir):
    serve.run(build_app(engine_args(tiny_model_dir, autoscaling=AUTOSCALING)), name=APP, route_prefix=PREFIX)
    try:
        replicas = ServeReplicas(APP, DEPLOYMENT)  # what `railyard bench burst --app --deployment` records
        assert running_replicas(APP, DEPLOYMENT) == replicas() == 0  # deployed idle: no replica until a request
        assert replicas_serving(serve_cluster.http_url) == 0
        for _ in range(2):  # from the initial zero, and again after scaling back to zero
            cold, cold_s = completion(serve_cluster.http_url)
            assert cold.status_code == 200, cold.text
            assert cold.json()["usage"]["completion_tokens"] == 8
            assert running_replicas(APP, DEPLOYMENT) == replicas() == 1
            warm, warm_s = completion(serve_cluster.http_url)  # the replica is up now
            assert warm.status_code == 200, warm.text
            print(f"first request after idle: {cold_s:.2f} s (waiting for a replica); the next: {warm_s:.2f} s")
            assert cold_s > warm_s + 0.5  # the first one waited for a replica to start
            asyncio.run(wait_until(lambda: running_replicas(APP, DEPLOYMENT) == 0, 60, "scale-down to zero"))
        # The ingress counted each new replica when it served its first request: two cold starts, two replicas.
        assert replicas_serving(serve_cluster.http_url) == 2
        # and timed each one's requests apart: two per replica, 8 tokens each at a positive time per token
        counts = {s.labels["replica"]: s.value
                  for s in metric_samples(serve_cluster.http_url, REPLICA_TPOT_METRIC + "_count")}
        sums = metric_samples(serve_cluster.http_url, REPLICA_TPOT_METRIC + "_sum")
        assert sorted(counts.values()) == [2.0, 2.0] and all(s.value > 0 for s in sums)
    finally:
        serve.delete(APP)
