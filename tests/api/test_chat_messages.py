"""OpenAI's message rules: every message has content, except an assistant message that carries tool_calls."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def chat(http: httpx.Client, *messages: dict) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 1, "messages": list(messages)})


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool", "assistant"])
@pytest.mark.parametrize("content", ["missing", None], ids=["missing", "null"])
def test_message_without_content_is_400_naming_it(http, role, content):
    message = {"role": role} if content == "missing" else {"role": role, "content": None}
    resp = chat(http, {"role": "user", "content": "hi"}, message)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "messages[1].content" and "needs content" in error["message"]


def test_empty_list_of_content_parts_is_400(http):
    resp = chat(http, {"role": "user", "content": []})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"


def test_assistant_message_with_tool_calls_may_omit_content(http):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    resp = chat(http, {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"})
    assert resp.status_code == 200, resp.text


def test_empty_string_content_is_content(http):
    assert chat(http, {"role": "system", "content": ""}, {"role": "user", "content": "hi"}).status_code == 200
