"""Standby engines on real Ray Serve: with autoscaling.standby_engines 1 the deployment's replica takes its engine
from its node's pool (a detached actor that parents the engine cores), the pool keeps one more asleep beside it, and a
replica that goes (the app deleted) gives its engine back asleep instead of stopping it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import ray
from ray import serve

from railyard.serve.app import build_app
from tests.serve.conftest import engine_args, wait_until

pytestmark = pytest.mark.timeout(300)

APP, PREFIX, DEPLOYMENT = "standby", "/standby", "engine-tiny-default"
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_pending_per_replica": 8, "standby_engines": 1}


def _pool():
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(f"railyard-standby-{DEPLOYMENT}-")]
    assert len(names) == 1, names
    return ray.get_actor(names[0], namespace=next(a["namespace"] for a in ray.util.list_named_actors(
        all_namespaces=True) if a["name"] == names[0]))


def test_a_replica_serves_from_the_pool_which_keeps_a_standby_and_takes_the_engine_back(serve_cluster,
                                                                                       tiny_model_dir):
    serve.run(build_app(engine_args(tiny_model_dir, autoscaling=AUTOSCALING)), name=APP, route_prefix=PREFIX)
    pool = None
    try:
        resp = httpx.post(f"{serve_cluster.http_url}{PREFIX}/v1/completions", timeout=120,
                          json={"model": "tiny", "prompt": [5, 17, 42, 99], "max_tokens": 8, "temperature": 0,
                                "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 8
        pool = _pool()
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 1, "claimed": 1, "starting": 0},
                               120, "a standby beside the replica's engine"))
        serve.delete(APP)
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 2, "claimed": 0, "starting": 0},
                               120, "the replica's engine back in the pool, asleep"))
    finally:
        serve.delete(APP)
        if pool is not None:
            ray.get(pool.shutdown.remote())
            ray.kill(pool)
