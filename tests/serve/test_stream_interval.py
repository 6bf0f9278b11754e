"""What crosses Ray per streamed request: every Ray stream item costs the replica, the ingress and the proxy
CPU, so a replica sends a request's first output at once, then at most one merged output per stream
interval, and its final output together with its stats: output tokens / tokens per interval + 2 items
(ReplicaStarted, the first output), never one item per token. Counted here on the items the replica's
stream carries, against an interval longer than the whole generation, and against interval 0 (an item per
engine step) as the oracle for the tokens."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve

from railyard.engine.config import SamplingParams
from railyard.serve.replica import EngineRequest, ReplicaReport, ReplicaStarted
from tests.serve.conftest import deploy_engines, engine_args

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 32
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def _args(model_dir: str, interval_s: float) -> dict:
    args = engine_args(model_dir)
    args["models"][0]["stream_interval_s"] = interval_s
    return args


async def _items(client, request_id: str) -> list:
    """Every item of one request's Ray stream, as the replica yielded it."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1,
                            output_kind="delta")
    request = EngineRequest(request_id, None, PROMPT, params)
    response = client.pools[0].handle.options(stream=True).generate.remote(request.to_dict())
    return [item async for item in response]


def test_a_replica_streams_the_first_token_alone_and_the_rest_with_the_final_output(serve_cluster, tiny_model_dir):
    clients = deploy_engines({"paced": _args(tiny_model_dir, 600.0), "unpaced": _args(tiny_model_dir, 0.0)})

    async def both() -> list[list]:
        return await asyncio.gather(_items(clients["paced"], "paced-1"), _items(clients["unpaced"], "unpaced-1"))

    try:
        paced, unpaced = asyncio.run(asyncio.wait_for(both(), timeout=120))
    finally:
        serve.delete("paced")
        serve.delete("unpaced")

    # The oracle: without an interval, about one item per engine step (fewer only while the replica's loop
    # lags behind the engine), plus ReplicaStarted.
    assert isinstance(unpaced[0], ReplicaStarted) and len(unpaced) > 3
    tokens = [t for item in unpaced[1:-1] for t in item.outputs[0].token_ids] + unpaced[-1].output.outputs[0].token_ids

    # An interval longer than the generation: ReplicaStarted, the first output, the final one (with the stats).
    assert len(paced) == 3
    started, first, last = paced
    assert isinstance(started, ReplicaStarted)
    assert not first.finished and first.outputs[0].token_ids
    assert isinstance(last, ReplicaReport) and last.output.finished and last.stats.num_total_blocks > 0
    assert first.outputs[0].token_ids + last.output.outputs[0].token_ids == tokens
    assert len(first.outputs[0].logprobs) + len(last.output.outputs[0].logprobs) == MAX_TOKENS
