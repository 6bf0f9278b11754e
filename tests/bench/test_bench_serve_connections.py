"""The bench client loses no request to a server's keep-alive timeout, and counts every failure by its type.

At 256 streams one request of 512 failed with an empty httpx.ReadError (docs/lab-notes): the client had
pooled the connection, the server closed it as idle, and the POST went out on it after the close.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from railyard.bench.serve import ServeBenchConfig, bench_client, run_serve_bench, send_request, summarize
from railyard.bench.workload import LengthRange
from tests.api.conftest import serve_in_thread, tiny_engine

KEEP_ALIVE_S = 1


@pytest.fixture(scope="module")
def short_keep_alive_server(tiny_model):
    with serve_in_thread(tiny_engine(tiny_model), timeout_keep_alive=KEEP_ALIVE_S) as running:
        yield running


def config(url: str, model: str, num_prompts: int = 2) -> ServeBenchConfig:
    return ServeBenchConfig(url=url, model=model, num_prompts=num_prompts, input_len=LengthRange(4, 4),
                            output_len=LengthRange(2, 2), max_concurrency=4, timeout_s=30)


async def hold_the_loop(seconds: float) -> None:
    """What hundreds of streams do to the client's event loop: nothing else runs for a while."""
    await asyncio.sleep(0)
    time.sleep(seconds)  # releases the GIL: the server thread keeps running (and closes idle connections)


def test_a_request_whose_bytes_go_out_after_the_servers_keep_alive_close_still_completes(short_keep_alive_server):
    server = short_keep_alive_server
    cfg = config(server.url, server.model)

    async def scenario():
        async with bench_client(cfg) as client:
            t0 = time.perf_counter()
            first = await send_request(client, cfg, [1, 2, 3, 4], 2, t0)
            await asyncio.sleep(KEEP_ALIVE_S - 0.2)  # idle, but not yet for as long as the server allows
            # The second request is handed its connection now, and its bytes go out only once the loop is free
            # again, after the server's keep-alive has run out.
            busy = asyncio.ensure_future(hold_the_loop(0.6))
            second = await send_request(client, cfg, [5, 6, 7, 8], 2, t0)
            await busy
            return first, second

    first, second = asyncio.run(scenario())
    assert first.ok, first.error
    assert second.ok, second.error  # with a pooled connection: "ReadError: no message (before the response headers)"
    assert second.output_tokens == 2


def test_failures_are_counted_by_type_and_do_not_end_the_run():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(f"http://127.0.0.1:{port}", "any", num_prompts=3)
    results, duration = asyncio.run(run_serve_bench(cfg))
    summary = summarize(cfg, results, duration)
    assert (summary["completed"], summary["failed"]) == (0, 3)
    assert summary["error_counts"] == {"ConnectError": 3}
    assert all(r.error.startswith("ConnectError: ") and r.error.endswith("(before the response headers)")
               for r in results)
