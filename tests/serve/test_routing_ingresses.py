"""Prefix affinity with two ingress processes: each holds its own deployment handle, so its own router.

The routers never talk to each other; what one sent a replica another learns only from the replicas' periodic
reports. Oracle: each finished request carries the engine's own count of prompt tokens found in its prefix cache,
and names the replica that served it.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import ray
from ray import serve

from tests.serve.conftest import Served, deploy_engine, engine_args, run_request

pytestmark = pytest.mark.timeout(300)

BLOCK = 16


@ray.remote(num_cpus=0)
class Ingress:
    """A second ingress process: its own handle to the engine deployment, hence its own request router."""

    def __init__(self, app_name: str, model_dir: str) -> None:
        from railyard.engine.tokenizer import load_tokenizer
        from railyard.model.spec import read_model_spec
        from railyard.serve.client import PoolHandle, RayEngineClient
        from railyard.serve.spec import parse_app_args

        pool = parse_app_args(engine_args(model_dir)).models[0].pools[0]
        handle = serve.get_deployment_handle(pool.deployment, app_name)
        self.client = RayEngineClient("tiny", [PoolHandle(pool.name, None, handle, 1024)], load_tokenizer(model_dir),
                                      max_model_len=1024, vocab_size=read_model_spec(model_dir).vocab_size)

    async def run(self, token_ids: list[int], max_tokens: int) -> Served:
        served = await run_request(self.client, token_ids, max_tokens)
        served.error = repr(served.error) if served.error else None  # exceptions need not pickle
        return served


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 256) for _ in range(n)]


def _trace(rng: random.Random, groups: int, per_group: int) -> list[list[int]]:
    """Requests in arrival order: group after group (each shares a 6-block prefix), per_group requests each."""
    prefixes = [_tokens(rng, 6 * BLOCK) for _ in range(groups)]
    return [p + _tokens(rng, 5) for p in prefixes for _ in range(per_group)]


async def _replay(senders, trace: list[list[int]], max_tokens: int, gap_s: float) -> list[Served]:
    """Request i through ingress i % len(senders), a new one every gap_s, all in flight together."""
    tasks = []
    for i, ids in enumerate(trace):
        tasks.append(asyncio.ensure_future(senders[i % len(senders)](ids, max_tokens)))
        await asyncio.sleep(gap_s)
    return list(await asyncio.gather(*tasks))


def test_two_ingresses_send_a_shared_prefix_to_one_replica(serve_cluster, tiny_model_dir):
    """A burst through both ingresses (each router's count of the other's requests goes stale), then 7 document
    groups of 3 requests through alternating ingresses, a group's next request well within the replicas' report
    period (0.5 s): every group stays on one replica, so the fleet computes each prefix once."""
    app, groups, per_group = "prefix-two-ingresses", 7, 3
    client = deploy_engine(engine_args(tiny_model_dir, num_replicas=2), app)
    other = Ingress.remote(app, tiny_model_dir)
    try:
        async def local(ids, max_tokens):
            return await run_request(client, ids, max_tokens)

        async def remote(ids, max_tokens):
            return await other.run.remote(ids, max_tokens)

        rng = random.Random(3)
        burst = [_tokens(rng, 24) for _ in range(16)]
        trace = _trace(rng, groups, per_group)

        async def scenario():
            await _replay([local, remote], burst, 48, 0.0)
            return await _replay([local, remote], trace, 4, 0.15)

        served = asyncio.run(scenario())
    finally:
        serve.delete(app)
    assert all(r.error is None for r in served), [r.error for r in served if r.error]
    placement: dict[int, set[str]] = {}
    for i, r in enumerate(served):
        placement.setdefault(i // per_group, set()).add(r.replica)
    assert all(len(replicas) == 1 for replicas in placement.values()), f"prefix groups split: {placement}"
    computed_once = sum(r.cached_prompt_tokens for r in served) / sum(r.prompt_tokens for r in served)
    assert computed_once >= 0.55, f"fleet prefix-cache hit rate {computed_once:.2f} (each prefix once: 0.63)"
