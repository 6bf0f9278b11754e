"""A reader that leaves a Ray-served stream (an HTTP client that disconnected) aborts its request in the
replica's engine, also while the replica holds outputs back for its stream interval: the engine's own
stats, read from the replica, show no request left running and every KV block free again."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve

from railyard.engine.config import SamplingParams
from tests.serve.conftest import deploy_engine, engine_args

pytestmark = pytest.mark.timeout(300)

APP = "cancellation"


def test_leaving_a_stream_mid_generation_aborts_the_request_in_the_replicas_engine(serve_cluster, tiny_model_dir):
    args = engine_args(tiny_model_dir)
    args["models"][0]["stream_interval_s"] = 600.0  # the reader leaves while the replica holds outputs back
    client = deploy_engine(args, APP)
    handle = client.pools[0].handle

    async def scenario():
        params = SamplingParams(temperature=0.0, max_tokens=800, ignore_eos=True, output_kind="delta")
        stream = await client.add_request("leaver", None, params, prompt_token_ids=[5, 6, 7, 8])
        outputs = stream.__aiter__()
        first = await outputs.__anext__()
        assert not first.finished
        running = await handle.stats.remote()
        await outputs.aclose()  # the client is gone

        async def engine_idle() -> bool:
            stats = await handle.stats.remote()
            return stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not await engine_idle():
            assert loop.time() < deadline, "the replica's engine still holds the abandoned request"
            await asyncio.sleep(0.2)
        return running

    try:
        running = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    finally:
        serve.delete(APP)
    assert running.num_running == 1  # the request was generating when its reader left
