"""Fuzzing both endpoints with hypothesis: whatever the body, never a 5xx, and the server still answers."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 300),
                    st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3), st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=8)
SHARED_FIELDS = ["n", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "seed", "stop", "stream", "stream_options", "max_tokens", "min_tokens",
                 "ignore_eos", "stop_token_ids", "skip_special_tokens", "logit_bias", "user", "model", "priority",
                 "include_stop_str_in_output", "not_an_openai_field"]
FIELDS = {
    "/v1/completions": SHARED_FIELDS + ["prompt", "logprobs", "echo", "best_of", "suffix"],
    "/v1/chat/completions": SHARED_FIELDS + ["messages", "logprobs", "top_logprobs", "max_completion_tokens",
                                             "response_format", "tools", "tool_choice", "add_generation_prompt"],
}
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]),
                                 "content": st.one_of(st.text(max_size=30), JSON)})
# Well-typed values in and around the valid ranges, so that many requests reach the engine.
TYPED = {
    "n": st.integers(1, 3), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1), "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.1, 2), "seed": st.integers(-2**63, 2**63 - 129),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "max_tokens": st.integers(1, 8),
    "min_tokens": st.integers(0, 8), "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(0, 300),
                                                                                             max_size=3),
    "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(), "priority": st.integers(-5, 5),
}
TYPED_BY_PATH = {
    "/v1/completions": {**TYPED, "logprobs": st.integers(0, 5), "prompt": st.one_of(
        st.text(max_size=20), st.lists(st.integers(0, 300), max_size=8), st.lists(st.text(max_size=5), max_size=2))},
    "/v1/chat/completions": {**TYPED, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
                             "max_completion_tokens": st.integers(1, 8), "add_generation_prompt": st.booleans(),
                             "messages": st.lists(st.fixed_dictionaries(
                                 {"role": st.sampled_from(["user", "system", "assistant"]),
                                  "content": st.text(max_size=20)}), max_size=3)},
}


def bodies(path: str, model: str):
    base = {"model": model, "max_tokens": 4}
    base.update({"prompt": "fuzz"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "f"}]})
    typed = st.fixed_dictionaries({}, optional=TYPED_BY_PATH[path])
    anything = st.dictionaries(st.sampled_from(FIELDS[path]), JSON, max_size=3)
    if path == "/v1/chat/completions":
        anything = st.one_of(anything, st.fixed_dictionaries({"messages": st.lists(MESSAGE, max_size=3)}))
    mutated = st.one_of(typed, anything).map(lambda extra: json.dumps({**base, **extra}).encode())
    junk = st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode()))
    return st.one_of(mutated, junk)


def post(client: httpx.Client, path: str, content: bytes) -> httpx.Response:
    with client.stream("POST", path, content=content, headers={"content-type": "application/json"}) as resp:
        resp.read()  # a streamed body is read to the end, [DONE] included
        return resp


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzzed_requests_never_get_a_5xx(server, path):
    statuses: list[int] = []

    with httpx.Client(base_url=server.url, timeout=120) as client:
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(content=bodies(path, server.model))
        def check(content: bytes) -> None:
            resp = post(client, path, content)
            statuses.append(resp.status_code)
            assert resp.status_code < 500, (content, resp.text)
            if resp.status_code >= 400:
                assert resp.json()["error"]["message"]
            elif resp.headers["content-type"].startswith("text/event-stream"):
                assert resp.text.rstrip().endswith("data: [DONE]") and '"error"' not in resp.text
            else:
                assert resp.json()["choices"]

        check()
        assert 200 in statuses and 400 in statuses  # the fuzzer reached both the engine and the validators
        ok = client.post("/v1/completions", json={"model": server.model, "prompt": "still there?", "max_tokens": 2})
        assert ok.status_code == 200 and client.get("/health").status_code == 200
    server.idle_stats()
    server.in_loop(server.engine.check_invariants())
