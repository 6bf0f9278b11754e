"""The front stays responsive whatever one request does: a multi-megabyte prompt is refused before it is
tokenised (it cannot fit in max_model_len), and while it is, /health and a running stream keep answering."""

from __future__ import annotations

import asyncio
import json
import time

import re
import signal

import httpx
import pytest

from tests.api.test_serve_cli import start_serve

HUGE_PROMPT_CHARS = 7_000_000  # ~7 MB of text, under the server's 8 MiB body limit
BOUND_S = 0.1


class Served:
    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model


@pytest.fixture(scope="module")
def server(tiny_model):
    """`railyard serve` in its own process, as users run it: the test's clients share no GIL with it."""
    proc, banner = start_serve(tiny_model)
    try:
        yield Served(re.search(r"on (http://\S+) ", banner).group(1), "demo")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_a_huge_prompt_is_refused_while_health_and_a_stream_keep_answering(server):
    huge_body = json.dumps({"model": server.model, "prompt": "word " * (HUGE_PROMPT_CHARS // 5)}).encode()

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            await client.get("/health")  # a warm connection for the probes
            stream_gaps: list[float] = []
            health_latencies: list[float] = []
            refused = asyncio.Event()

            async def stream() -> None:
                body = {"model": server.model, "prompt": "hello", "max_tokens": 200, "ignore_eos": True,
                        "stream": True}
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as own:
                    async with own.stream("POST", "/v1/completions", json=body) as resp:
                        last = None
                        async for line in resp.aiter_lines():
                            now = time.perf_counter()
                            if line.startswith("data: ") and last is not None and not refused.is_set():
                                stream_gaps.append(now - last)
                            last = now

            async def huge() -> httpx.Response:
                await asyncio.sleep(0.3)  # the stream is running
                try:
                    return await client.post("/v1/completions", content=huge_body,
                                             headers={"content-type": "application/json"})
                finally:
                    refused.set()

            async def probe() -> None:
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as own:
                    while not refused.is_set():
                        start = time.perf_counter()
                        assert (await own.get("/health")).status_code == 200
                        health_latencies.append(time.perf_counter() - start)
                        await asyncio.sleep(0.01)

            streaming = asyncio.ensure_future(stream())
            resp, _ = await asyncio.gather(huge(), probe())
            await streaming
            return resp, health_latencies, stream_gaps

    resp, health, gaps = asyncio.run(main())
    assert resp.status_code == 400 and "maximum context length" in resp.json()["error"]["message"]
    assert health and max(health) < BOUND_S, f"/health took {max(health):.3f} s while a huge prompt was refused"
    assert gaps and max(gaps) < BOUND_S, f"a stream stalled {max(gaps):.3f} s while a huge prompt was refused"
