"""Autoscaling on pending requests per replica, on real Ray Serve: up under a burst, back down after it,
and not one request lost either way (scale-down drains before it stops a replica)."""

from __future__ import annotations

import asyncio
import random

import pytest
from ray import serve

from tests.serve.conftest import (
    deploy_engine,
    engine_args,
    run_request,
    running_replicas,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)

APP, DEPLOYMENT = "autoscale", "engine-tiny-default"
AUTOSCALING = {"min_replicas": 1, "max_replicas": 3, "target_pending_per_replica": 2, "upscale_delay_s": 1.0,
               "downscale_delay_s": 3.0, "metrics_interval_s": 0.5, "look_back_period_s": 1.0}


def test_a_burst_scales_up_to_three_replicas_and_back_to_one_without_failures(serve_cluster, tiny_model_dir):
    client = deploy_engine(engine_args(tiny_model_dir, autoscaling=AUTOSCALING), APP)
    rng = random.Random(0)
    served, replica_counts = [], []

    async def worker(stop: asyncio.Event, max_tokens: int) -> None:
        while not stop.is_set():
            served.append(await run_request(client, [rng.randrange(256) for _ in range(32)], max_tokens))

    async def load_until(predicate, concurrency: int, max_tokens: int, timeout_s: float, what: str) -> None:
        stop = asyncio.Event()
        workers = [asyncio.ensure_future(worker(stop, max_tokens)) for _ in range(concurrency)]
        try:
            await wait_until(lambda: predicate(_observe()), timeout_s, what)
        finally:
            stop.set()
            await asyncio.gather(*workers)

    def _observe() -> int:
        n = running_replicas(APP, DEPLOYMENT)
        replica_counts.append(n)
        return n

    async def scenario() -> None:
        assert _observe() == 1
        # The burst: 12 requests always pending against a target of 2 per replica -> max_replicas.
        await load_until(lambda n: n == 3, 12, 96, 150, "scale-up to 3 replicas")
        # The end of the burst: one long request at a time (pending 1: one replica is enough), so a
        # replica being removed may well be streaming it when told to stop: it must drain, not drop it.
        await load_until(lambda n: n == 1, 1, 160, 90, "scale-down to 1 replica")

    try:
        asyncio.run(scenario())
    finally:
        serve.delete(APP)
    failures = [r.error for r in served if r.error is not None]
    assert not failures, f"{len(failures)} of {len(served)} requests failed: {failures[:3]}"
    assert max(replica_counts) == 3 and replica_counts[-1] == 1
    assert len({r.replica for r in served}) == 3, "every replica the burst added took requests"
