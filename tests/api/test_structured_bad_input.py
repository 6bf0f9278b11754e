"""Bad constraints and bad tools are a 400 with an OpenAI-style body that says what is wrong, before any
response starts (also for streams), and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest

from railyard.engine.structured.compiler import GrammarCompiler
from tests.api.conftest import serve_in_thread, tiny_engine
from tests.api.test_bad_input import assert_openai_error

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def bad(http, path: str, status: int = 400, **body) -> str:
    base = {"model": "tiny", "max_tokens": 4}
    base.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    for stream in (False, True):  # a stream is refused before its first byte, with the same body
        resp = http.post(path, json={**base, **body, "stream": stream})
        message = assert_openai_error(resp, status)["message"]
    return message


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("body, says", [
    ({"structured_outputs": {"json": {"type": "frobnicate"}}}, 'Unsupported type "frobnicate"'),
    ({"guided_json": {"type": "object", "properties": {"a": 3}}}, "Schema should be an object or bool"),
    ({"guided_json": "{not json"}, "not valid JSON"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}}}},
     "$defs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}}, "'uniqueItems'"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}}, "multipleOf"),
    ({"guided_json": {"not": {"type": "string"}}}, "'not'"),
    ({"guided_json": {"type": "string", "format": "credit-card"}}, "format 'credit-card'"),
    ({"guided_regex": "a(b"}, "invalid regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, 'Rule "undefined_rule" is not defined'),
    ({"guided_choice": []}, "choice"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "one output constraint"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "one output constraint"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "xgrammar"),
])
def test_a_bad_constraint_is_a_400_that_names_the_problem(http, path, body, says):
    assert says in bad(http, path, **body)


@pytest.mark.parametrize("body, says", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "'get_time', which is not in 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                               "properties": []}}}]},
     "properties must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools[0] (f)"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "a string"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "used twice"),
    ({"tool_choice": "required"}, "tool_choice needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "one output constraint"),
])
def test_bad_tools_are_a_400_that_names_the_problem(http, body, says):
    assert says in bad(http, "/v1/chat/completions", **body)


def test_the_server_goes_on_after_bad_constraints(http, server):
    resp = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8, "temperature": 0,
                                              "structured_outputs": {"regex": "[0-9]{3}"}})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"].isdigit()
    assert http.get("/health").status_code == 200
    assert server.idle_stats().num_pending == 0


def test_a_constraint_the_engine_fails_to_compile_is_a_400_and_only_its_request_fails(tiny_model, monkeypatch):
    """The door's check parses every constraint; should the engine's compile still fail, that request alone is
    refused (a 400, or an error event once a stream has started) and the others go on."""
    def failing_compile(self, spec):
        raise RuntimeError("[12:00:00] /project/cpp/compiler.cc:1: out of memory")

    monkeypatch.setattr(GrammarCompiler, "_compile", failing_compile)
    with serve_in_thread(tiny_engine(tiny_model, engine_process=False)) as running:  # the patch reaches its core
        with httpx.Client(base_url=running.url, timeout=60) as client:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "guided_regex": "[a-z]+"}
            assert "out of memory" in assert_openai_error(client.post("/v1/completions", json=body), 400)["message"]
            events = client.post("/v1/completions", json={**body, "stream": True}).text
            assert '"type":"invalid_request_error"' in events and "out of memory" in events
            plain = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3,
                                                          "ignore_eos": True})
            assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 3
