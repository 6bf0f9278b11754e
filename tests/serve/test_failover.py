"""Failover on real Ray: a replica actor killed under load loses no request that had not started
(those are retried on the other replica), and Serve brings the deployment back to its size."""

from __future__ import annotations

import asyncio
import random

import pytest
import ray
from ray import serve

from railyard.errors import EngineDeadError
from tests.serve.conftest import (
    deploy_engine,
    engine_args,
    run_request,
    running_replicas,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)

APP, DEPLOYMENT = "failover", "engine-tiny-default"


def test_killing_a_replica_under_load_loses_no_request_that_had_not_started(serve_cluster, tiny_model_dir):
    # Two sequences run at once per engine and up to 12 requests wait in it: the victim dies holding
    # requests that have started (streaming) and requests that have not (queued in its engine).
    args = engine_args(tiny_model_dir, num_replicas=2, engine={"max_num_seqs": 2}, pool={"max_ongoing_requests": 12})
    client = deploy_engine(args, APP)
    rng = random.Random(0)

    async def scenario():
        victim: dict[str, str] = {}
        started: set[int] = set()

        def on_start(i: int):
            def note(replica: str) -> None:
                started.add(i)
                victim.setdefault("replica", replica)
            return note

        tasks = [asyncio.ensure_future(run_request(client, [rng.randrange(256) for _ in range(24)], 120,
                                                   on_start=on_start(i))) for i in range(16)]
        await wait_until(lambda: "replica" in victim, 60, "the first token")
        await asyncio.sleep(0.3)
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#{victim['replica']}", namespace="serve"),
                 no_restart=True)
        served = await asyncio.gather(*tasks)
        await wait_until(lambda: running_replicas(APP, DEPLOYMENT) == 2, 90, "the replacement replica")
        return victim["replica"], served

    try:
        dead, served = asyncio.run(scenario())  # it waited for the replacement replica to run (2 again)
    finally:
        serve.delete(APP)
    lost = [r for r in served if r.error is not None and not r.started]
    assert not lost, f"{len(lost)} requests that had not started were lost: {[r.error for r in lost]}"
    cut = [r for r in served if r.error is not None]
    assert all(isinstance(r.error, EngineDeadError) and "died after it had started" in str(r.error) for r in cut)
    assert all(r.replica == dead for r in cut), "only requests streaming from the killed replica may fail"
    retried = [r for r in served if r.error is None and dead in r.replicas_tried]
    assert retried, "some requests queued at the killed replica were retried elsewhere"
    assert all(r.num_tokens == 120 for r in served if r.error is None)
