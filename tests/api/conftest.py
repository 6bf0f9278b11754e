"""A real uvicorn server on localhost, in a background thread, serving the tiny model (shared per session).

The engine runs as it does under `railyard serve`: its core in its own process (EngineProcessClient).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn

from railyard.api.app import engine_app
from railyard.engine.client.base import CoreClient
from railyard.engine.config import EngineConfig
from railyard.engine.client.inproc import InProcessEngineClient
from railyard.engine.client.process import EngineProcessClient
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.engine.tokenizer import load_tokenizer

MODEL_NAME = "tiny"
MAX_MODEL_LEN = 256


@dataclass
class RunningServer:
    url: str
    engine: CoreClient
    model: str = MODEL_NAME
    app: Any = None  # the FastAPI app, for tests that break one of its parts on purpose

    def in_loop(self, coro, timeout: float = 60.0):
        """Run a coroutine on the server's event loop (where the engine lives) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.engine.loop).result(timeout)

    def idle_stats(self, timeout: float = 30.0):
        """Engine stats once nothing is running or waiting (aborts land between steps)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats
            if self.engine.num_pending == 0 and not len(self.engine.processor) or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)


@contextmanager
def serve_in_thread(engine: CoreClient, timeout_keep_alive: float = 60, **app_kwargs) -> Iterator[RunningServer]:
    """uvicorn on 127.0.0.1 (any free port) until the block ends."""
    app = engine_app(engine, served_model_name=MODEL_NAME, **app_kwargs)
    # Client and server share this process (and its GIL): a long keep-alive keeps a loaded test client from
    # reusing a connection uvicorn has just closed as idle.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_keep_alive=timeout_keep_alive))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", engine, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def tiny_engine(model_dir: str, *, engine_process: bool = True, **overrides) -> CoreClient:
    """An engine client for the tiny model: its core in its own process (as served), or on a thread."""
    config = dict(model=model_dir, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=1024, max_num_seqs=64)
    max_waiting = overrides.pop("max_waiting_requests", 4096)
    config = EngineConfig(**{**config, **overrides})
    if engine_process:
        return EngineProcessClient(config, max_waiting_requests=max_waiting)
    return InProcessEngineClient.from_config(config, max_waiting_requests=max_waiting)


@pytest.fixture(scope="session")
def server(tiny_model) -> Iterator[RunningServer]:
    with serve_in_thread(tiny_engine(tiny_model)) as running:
        yield running


@pytest.fixture(scope="session")
def structured_server(tmp_path_factory) -> Iterator[RunningServer]:
    """Room for a 256-request batch and for tools prompts (a byte per token: the tiny model, with 4k positions);
    compact constrained JSON (the tiny random model would otherwise ramble in the whitespace a grammar allows)."""
    model = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-4k"), max_position_embeddings=4096)
    engine = tiny_engine(str(model), max_model_len=2048, max_num_seqs=256, structured_outputs_disable_any_whitespace=True)
    with serve_in_thread(engine) as running:
        yield running


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)
