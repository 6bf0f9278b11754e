"""A 5xx never poisons a pooled keep-alive connection: it is sent with `Connection: close`, so the client
opens a new connection and its next request is served (a reset would lose it)."""

from __future__ import annotations

import httpx
import pytest

from railyard.api.protocol import CompletionRequest
from tests.api.conftest import serve_in_thread, tiny_engine


@pytest.fixture
def buggy(tiny_model):
    """A server whose /v1/completions hits a bug (an exception no handler maps to a status), as a new defect
    would; chat completions still work."""
    with serve_in_thread(tiny_engine(tiny_model)) as running:
        gen = running.app.state.generation
        sampling_params = gen.sampling_params

        def with_a_bug(req, *args, **kwargs):
            if isinstance(req, CompletionRequest):
                raise RuntimeError("a bug")
            return sampling_params(req, *args, **kwargs)

        gen.sampling_params = with_a_bug
        yield running


def test_a_500_says_connection_close_and_the_next_request_on_the_pool_is_served(buggy):
    bad = {"model": buggy.model, "prompt": "hi", "max_tokens": 1}
    good = {"model": buggy.model, "max_tokens": 1, "messages": [{"role": "user", "content": "still there?"}]}
    with httpx.Client(base_url=buggy.url, timeout=60) as client:  # one pool of keep-alive connections
        for _ in range(3):
            resp = client.post("/v1/completions", json=bad)
            assert resp.status_code == 500 and resp.headers["connection"] == "close"
            assert resp.json()["error"]["type"] == "server_error"
            assert client.post("/v1/chat/completions", json=good).status_code == 200
