"""Hypothesis over the request models themselves: every field each model declares (so a new field is fuzzed
the day it is added), values drawn from its own annotation, plus what schema-driven fuzzers cannot send:
strings with lone UTF-16 surrogates (as JSON escapes or as raw CESU-8 bytes) and bodies with bytes that are
not UTF-8. Whatever arrives: never a 5xx, an OpenAI-style error body for every 4xx, and the server, its
connection and the engine's block accounting all intact afterwards. Bounded: ~100 bodies per endpoint.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from railyard.api.protocol import ChatCompletionRequest, CompletionRequest

# Text as clients send it, and as they should not: lone surrogates (never valid Unicode) mixed in.
def texts(min_size: int = 0) -> st.SearchStrategy[str]:
    """Valid text, or text around a lone surrogate (st.text never draws one: JSON and Python let it through)."""
    broken = st.builds("{}{}{}".format, st.text(max_size=4), st.characters(categories=["Cs"]), st.text(max_size=4))
    return st.text(min_size=min_size, max_size=12) | broken


TEXT, WORDS = texts(), texts(min_size=1)
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
                    max_leaves=6)
# The fields that set how much work a request is: small, so that a hundred bodies run in seconds.
COST = {"n": st.integers(-1, 3), "best_of": st.integers(-1, 3), "max_tokens": st.integers(-1, 6),
        "max_completion_tokens": st.integers(-1, 6), "min_tokens": st.integers(-1, 6),
        "truncate_prompt_tokens": st.integers(-1, 6), "messages": st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
            optional={"content": st.one_of(TEXT, JSON), "name": TEXT, "tool_calls": JSON}), max_size=3)}
# Invalid UTF-8, spliced into the encoded body: a lone continuation byte, an overlong '/', a truncated
# sequence, CESU-8 for U+D800, and 0xFF, which never occurs in UTF-8.
BAD_BYTES = [b"\x80", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xff"]


def values(annotation: Any) -> st.SearchStrategy:
    """Values of a field's type (its range constraints are the validators' to judge), or any JSON at times."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return values(args[0])
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*map(values, args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(values(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(TEXT, values(args[1]), max_size=3)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return st.fixed_dictionaries({}, optional={n: values(f.annotation) for n, f in annotation.model_fields.items()})
    simple = {type(None): st.none(), bool: st.booleans(), int: st.integers(), float: st.floats(), str: TEXT}
    return simple.get(annotation, JSON)


def request_bodies(model: type[BaseModel], required: dict) -> st.SearchStrategy[bytes]:
    """A request whose text (and at times its model) is drawn, with up to two more of the model's fields
    drawn anew; encoded one way or the other, maybe with bad bytes spliced in."""
    fields = {name: COST.get(name, values(f.annotation) | JSON) for name, f in model.model_fields.items()}
    picked = st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)
    extra = picked.flatmap(lambda names: st.fixed_dictionaries({n: fields[n] for n in names}))
    drawn = st.tuples(st.fixed_dictionaries(required), extra).map(lambda parts: {**parts[0], **parts[1]})
    return st.tuples(drawn, st.sampled_from(["escaped", "cesu-8"]), st.none() | st.tuples(
        st.sampled_from(BAD_BYTES), st.floats(0, 1))).map(encode)


def encode(args: tuple[dict, str, tuple[bytes, float] | None]) -> bytes:
    body, how, splice = args
    if how == "escaped":  # lone surrogates as \ud800 escapes, the rest ASCII
        data = json.dumps(body).encode()
    else:  # lone surrogates as the raw bytes Python's surrogatepass writes (what json.loads lets through)
        data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if splice is not None:
        bad, where = splice
        at = int(where * len(data))
        data = data[:at] + bad + data[at:]
    return data


MODEL = st.one_of(st.just("tiny"), st.just("tiny"), st.just("tiny"), TEXT)  # mostly the served one
ENDPOINTS = {
    "/v1/completions": (CompletionRequest, {"model": MODEL, "prompt": WORDS | st.lists(WORDS, max_size=2),
                                            "max_tokens": st.just(2)}),
    "/v1/chat/completions": (ChatCompletionRequest, {"model": MODEL, "max_tokens": st.just(2), "messages": st.lists(
        st.fixed_dictionaries({"role": st.just("user"), "content": WORDS | st.lists(st.fixed_dictionaries(
            {"type": st.just("text"), "text": WORDS}), min_size=1, max_size=2)}), min_size=1, max_size=2)}),
}
VALID = {"/v1/completions": {"model": "tiny", "prompt": "still there?", "max_tokens": 2},
         "/v1/chat/completions": {"model": "tiny", "max_tokens": 2,
                                  "messages": [{"role": "user", "content": "still there?"}]}}


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_model_driven_fuzzing_with_invalid_unicode_never_gets_a_5xx(server, path):
    model, required = ENDPOINTS[path]
    statuses: list[int] = []
    with httpx.Client(base_url=server.url, timeout=120) as client:  # one keep-alive connection throughout

        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        @given(content=request_bodies(model, required))
        def check(content: bytes) -> None:
            with client.stream("POST", path, content=content, headers={"content-type": "application/json"}) as resp:
                resp.read()
            statuses.append(resp.status_code)
            assert resp.status_code < 500, (content, resp.text)
            if resp.status_code >= 400:
                assert resp.json()["error"]["message"]
            elif resp.headers["content-type"].startswith("text/event-stream"):
                assert resp.text.rstrip().endswith("data: [DONE]")
            else:
                assert resp.json()["choices"]

        check()
        assert 200 in statuses and 400 in statuses  # both the engine and the validators were reached
        assert client.post(path, json=VALID[path]).status_code == 200
    server.idle_stats()
    server.in_loop(server.engine.check_invariants())
