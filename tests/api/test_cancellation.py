"""Clients that leave mid-stream: their requests are aborted and their KV blocks freed; nobody else is hurt."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from tests.api.test_metrics import scrape

NUM_REQUESTS = 2000
CONCURRENCY = 64
CANCEL_FRACTION = 0.3
MAX_TOKENS = 10


async def stream_completion(client: httpx.AsyncClient, model: str, prompt: str, cancel_after: int | None) -> dict:
    """Read one SSE completion; with cancel_after, close the connection after that many events."""
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True,
            "temperature": 0.8, "seed": 1}
    text, events, finish = "", 0, None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            events += 1
            if cancel_after is not None and events >= cancel_after:
                return {"cancelled": True}  # leaving the block closes the connection mid-stream
    return {"cancelled": False, "finish_reason": finish, "text": text}


async def run_load(url: str, model: str) -> list[dict]:
    rng = random.Random(0)
    plan = [(f"request {i}: " + "x" * rng.randint(1, 40), 2 if rng.random() < CANCEL_FRACTION else None)
            for i in range(NUM_REQUESTS)]
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        async def one(prompt: str, cancel_after: int | None) -> dict:
            async with gate:
                return await stream_completion(client, model, prompt, cancel_after)

        return await asyncio.gather(*(one(p, c) for p, c in plan))


def test_cancelled_streams_free_their_blocks_and_the_rest_complete(server):
    finished_before = server.engine.stats.num_requests_finished_total
    results = asyncio.run(run_load(server.url, server.model))
    kept = [r for r in results if not r["cancelled"]]
    assert 0.25 * NUM_REQUESTS < NUM_REQUESTS - len(kept) < 0.35 * NUM_REQUESTS
    assert all(r["finish_reason"] == "length" for r in kept)  # every request not cancelled ran to the end
    stats = server.idle_stats()
    assert (stats.num_running, stats.num_waiting, stats.num_swapped) == (0, 0, 0)
    aborted = NUM_REQUESTS - (stats.num_requests_finished_total - finished_before)
    print(f"{NUM_REQUESTS - len(kept)} cancelled by the client, {aborted} aborted before their last token")
    assert aborted > 0.5 * (NUM_REQUESTS - len(kept))  # cancellation reached the engine, not just the socket
    # Only the prefix cache may still hold blocks, and those are all reclaimable (free or evictable).
    assert stats.num_free_blocks == stats.num_total_blocks and stats.kv_cache_usage == 0.0
    server.in_loop(server.engine.check_invariants())
    gauges = scrape(server.url)  # what dashboards and autoscalers see: nothing running, no KV held
    assert gauges["vllm:num_requests_running"] == gauges["vllm:num_requests_waiting"] == 0
    assert gauges["vllm:kv_cache_usage_perc"] == 0.0
    assert len(server.engine.processor) == 0
