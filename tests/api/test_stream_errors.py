"""An accepted streamed request is never just dropped: if the engine dies mid-stream, the client gets an
OpenAI-style error event and [DONE] on a response that ends cleanly, not a closed connection or a hang."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from tests.api.conftest import serve_in_thread, tiny_engine

STREAMS = {
    "completion": ("/v1/completions", {"prompt": "hello"}),
    "completion of two prompts": ("/v1/completions", {"prompt": ["hello", "world"]}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}),
}


@pytest.mark.parametrize("kind", STREAMS)
def test_an_engine_killed_mid_stream_ends_every_open_stream_with_an_error_event(tiny_model, kind):
    path, fields = STREAMS[kind]
    engine = tiny_engine(tiny_model)
    with serve_in_thread(engine) as server:
        body = {"model": server.model, "max_tokens": 200, "ignore_eos": True, "stream": True, **fields}
        lines = []
        with httpx.stream("POST", server.url + path, json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():  # raises if the connection is cut
                if line:
                    lines.append(line)
                if len(lines) == 3:
                    os.kill(engine.pid, signal.SIGKILL)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert any(e.get("choices") for e in events[:-1])  # tokens went out before the failure
    error = events[-1]["error"]
    assert error["type"] == "service_unavailable_error" and "died" in error["message"]


def test_an_in_process_engine_failure_mid_stream_ends_the_stream_with_an_error_event(tiny_model):
    engine = tiny_engine(tiny_model, engine_process=False)
    with serve_in_thread(engine) as server:
        real_step, steps = engine.core.step, []

        def step_then_fail():
            steps.append(1)
            if len(steps) > 3:
                raise RuntimeError("device lost")  # what a failed kernel or a lost GPU looks like to the loop
            return real_step()

        engine.core.step = step_then_fail
        body = {"model": server.model, "max_tokens": 40, "ignore_eos": True, "stream": True, "prompt": "hello"}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert "device lost" in json.loads(lines[-2].removeprefix("data: "))["error"]["message"]
