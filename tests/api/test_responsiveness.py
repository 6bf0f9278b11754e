"""The front stays responsive whatever one request does: a multi-megabyte prompt is refused before it is
tokenised (it cannot fit in max_model_len), and while it is, /health and a running stream keep answering.

No wall-clock bound: the control is what tokenising that prompt costs on this machine in the same run (what the
event loop would have stalled for, had the server tokenised it there); the stalls must be a small part of it."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import httpx
import pytest

from railyard.engine.tokenizer import load_tokenizer
from tests.api.test_serve_cli import start_serve

pytestmark = pytest.mark.slow  # a `railyard serve` process and a multi-megabyte prompt

HUGE_PROMPT_CHARS = 7_000_000  # ~7 MB of text, under the server's 8 MiB body limit
SLICE = 50  # the control tokenises 1/SLICE of the prompt and scales it (tokenising is linear in the text)
STALL_FRACTION = 0.1  # a stall must stay under this part of the control
STREAM_TOKENS = 1000  # the running stream's budget: it stops once it has streamed past the huge prompt's answer


class Served:
    def __init__(self, url: str, model: str, model_dir: str) -> None:
        self.url, self.model, self.model_dir = url, model, model_dir


def tokenizing_seconds(model_dir: str, text: str) -> float:
    """What tokenising `text` with the model's tokenizer costs here and now, from a 1/SLICE slice of it."""
    tokenizer = load_tokenizer(model_dir)
    part = text[: len(text) // SLICE]
    started = time.perf_counter()
    tokenizer.encode(part)
    return (time.perf_counter() - started) * SLICE


@pytest.fixture(scope="module")
def server(tiny_model):
    """`railyard serve` in its own process, as users run it: the test's clients share no GIL with it."""
    proc, banner = start_serve(tiny_model, "--max-model-len", str(STREAM_TOKENS + 16))  # the last flag wins
    try:
        yield Served(re.search(r"on (http://\S+) ", banner).group(1), "demo", tiny_model)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_a_huge_prompt_is_refused_while_health_and_a_stream_keep_answering(server):
    huge_prompt = "word " * (HUGE_PROMPT_CHARS // 5)
    huge_body = json.dumps({"model": server.model, "prompt": huge_prompt}).encode()

    async def main():
        events: list[float] = []  # arrival times of the running stream's chunks
        health_latencies: list[float] = []
        streaming, probing, refused = asyncio.Event(), asyncio.Event(), asyncio.Event()
        window: list[float] = []  # when the huge request was sent, and when its answer came

        async def stream() -> None:
            body = {"model": server.model, "prompt": "hello", "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                    "stream": True}
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as own:
                async with own.stream("POST", "/v1/completions", json=body) as resp:
                    assert resp.status_code == 200, await resp.aread()
                    async for line in resp.aiter_lines():
                        if line.startswith("data: "):
                            events.append(time.perf_counter())
                            if len(events) == 3:
                                streaming.set()
                            if len(window) == 2 and events[-1] > window[1]:
                                return  # it ran past the huge prompt's answer: enough (closing it cancels it)

        def send_huge() -> httpx.Response:  # on a thread: writing 7 MB must not hold up this loop's readers
            window.append(time.perf_counter())
            try:
                return httpx.post(server.url + "/v1/completions", content=huge_body,
                                  headers={"content-type": "application/json"}, timeout=60)
            finally:
                window.append(time.perf_counter())

        async def huge() -> httpx.Response:
            await probing.wait()
            try:
                return await asyncio.to_thread(send_huge)
            finally:
                refused.set()

        async def probe() -> None:
            await streaming.wait()
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as own:
                await own.get("/health")  # a warm connection
                probing.set()
                while True:  # at least one probe, then until the huge prompt's answer came
                    start = time.perf_counter()
                    assert (await own.get("/health")).status_code == 200
                    health_latencies.append(time.perf_counter() - start)
                    if refused.is_set():
                        return
                    await asyncio.sleep(0.01)

        streamed = asyncio.ensure_future(stream())
        await asyncio.wait([streamed, asyncio.ensure_future(streaming.wait())], return_when=asyncio.FIRST_COMPLETED)
        if streamed.done():
            streamed.result()  # the stream failed (or ended) before it was under way: say why
        resp, _ = await asyncio.gather(huge(), probe())
        await streamed
        return resp, health_latencies, events, window

    resp, health, events, (sent, answered) = asyncio.run(main())
    assert resp.status_code == 400 and "maximum context length" in resp.json()["error"]["message"]
    bound = STALL_FRACTION * tokenizing_seconds(server.model_dir, huge_prompt)  # measured after, under the same load
    assert health and max(health) < bound, f"/health took {max(health):.3f} s (bound {bound:.3f} s)"
    # The stream's gaps that overlap the huge request's time in the server (at least the one spanning it).
    assert events[-1] > answered, f"the stream ended {answered - events[-1]:.3f} s before the huge prompt's answer"
    gaps = [b - a for a, b in zip(events, events[1:]) if b >= sent and a <= answered]
    assert gaps and max(gaps) < bound, f"a stream stalled {max(gaps):.3f} s (bound {bound:.3f} s)"
