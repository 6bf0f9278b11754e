"""Structured outputs over HTTP: the tiny random-weight model writes gibberish unless constrained, so every
valid output below is the constraint's doing. The oracles: the real schema through `jsonschema`, Python's
`re`, the official openai client's `parse`."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.api.structured_schemas import SCHEMAS


@pytest.fixture(scope="module")
def so_server(structured_server):
    return structured_server


@pytest.fixture(scope="module")
def http(so_server):
    with httpx.Client(base_url=so_server.url, timeout=300) as client:
        yield client


def completion(http, **body) -> dict:
    resp = http.post("/v1/completions", json={"model": "tiny", "prompt": "Answer:", **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def chat(http, **body) -> dict:
    resp = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                                                   **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def test_every_output_of_209_concurrent_requests_over_11_schemas_validates(so_server):
    """11 schemas (nested objects, bounded arrays, enums, number ranges, optional fields, $ref/$defs, anyOf,
    patterns, const, tuples) x 19 requests (greedy and seeded sampling, both endpoints), all in flight at once."""
    schemas = {k: v for k, v in SCHEMAS.items() if k != "string-lengths"}

    async def run() -> list[tuple[str, dict]]:
        async with httpx.AsyncClient(base_url=so_server.url, timeout=600) as client:
            calls = []
            for name, schema in schemas.items():
                fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
                for i in range(19):
                    body = {"model": "tiny", "max_tokens": 200, "temperature": 1.0 if i else 0.0, "seed": i,
                            "response_format": fmt}
                    if i % 3:
                        calls.append((name, client.post("/v1/completions", json={**body, "prompt": f"#{i}:"})))
                    else:
                        calls.append((name, client.post("/v1/chat/completions", json={
                            **body, "messages": [{"role": "user", "content": f"Give me {name} #{i}"}]})))
            resps = await asyncio.gather(*(c for _, c in calls))
            return [(name, r.json()) for (name, _), r in zip(calls, resps)]

    results = asyncio.run(run())
    assert len(results) >= 200 and len(schemas) >= 10
    for name, body in results:
        choice = body["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_length_bounded_strings_are_valid_json(http):
    """xgrammar 0.2's rule for minLength/maxLength strings admits raw control characters (invalid JSON); the
    engine rewrites those bounds into an equivalent pattern. (Random byte-level sampling can still pick an
    overlong or surrogate UTF-8 sequence xgrammar lets through; it decodes to U+FFFD characters, which lengthen
    the text, so only the outputs without one are held to the bounds.)"""
    schema = SCHEMAS["string-lengths"]
    texts = [completion(http, max_tokens=100, temperature=1.0, seed=seed,
                        structured_outputs={"json": schema})["text"] for seed in range(24)]
    for text in texts:
        value = json.loads(text)  # strict: a raw control character inside a string fails here
        if "\ufffd" not in text:
            jsonschema.validate(value, schema)
    assert sum("\ufffd" not in t for t in texts) >= 12


@pytest.mark.parametrize("spelling", ["structured_outputs", "guided"])
def test_regex_outputs_match_on_both_endpoints(http, spelling):
    pattern = r"[A-Z][a-z]{2,6} (19|20)\d\d-(0[1-9]|1[0-2])"
    body = {"structured_outputs": {"regex": pattern}} if spelling == "structured_outputs" else {"guided_regex": pattern}
    for seed in range(4):
        assert re.fullmatch(pattern, completion(http, max_tokens=40, temperature=1.0, seed=seed, **body)["text"])
        assert re.fullmatch(pattern, chat(http, max_tokens=40, temperature=1.0, seed=seed, **body)["message"]["content"])


@pytest.mark.parametrize("spelling", ["structured_outputs", "guided"])
def test_choice_outputs_are_one_of_the_choices(http, spelling):
    choices = ["positive", "negative", "it's \"complicated\"", "ünïcode ✓"]
    body = {"structured_outputs": {"choice": choices}} if spelling == "structured_outputs" else {"guided_choice": choices}
    seen = {completion(http, max_tokens=30, temperature=1.5, seed=seed, **body)["text"] for seed in range(12)}
    assert seen <= set(choices) and len(seen) > 1


def test_grammar_outputs_follow_the_grammar(http):
    grammar = 'root ::= greeting " " name "!"\ngreeting ::= "Hello" | "Hi"\nname ::= [A-Z] [a-z]{1,5}'
    for body in ({"structured_outputs": {"grammar": grammar}}, {"guided_grammar": grammar}):
        text = completion(http, max_tokens=30, temperature=1.0, seed=1, **body)["text"]
        assert re.fullmatch(r"(Hello|Hi) [A-Z][a-z]{1,5}!", text)


def test_guided_json_and_json_object(http):
    schema = SCHEMAS["enums"]
    jsonschema.validate(json.loads(completion(http, max_tokens=60, temperature=0.0, guided_json=schema)["text"]), schema)
    jsonschema.validate(json.loads(completion(http, max_tokens=60, temperature=0.0,
                                              guided_json=json.dumps(schema))["text"]), schema)
    finished = 0
    for seed in range(6):  # random JSON strings can run on: those cut by max_tokens are still an object's start
        choice = chat(http, max_tokens=120, temperature=0.7, seed=seed, response_format={"type": "json_object"})
        text = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            finished += 1
            assert isinstance(json.loads(text), dict)
        else:
            assert choice["finish_reason"] == "length" and text.startswith("{")
    assert finished


def test_a_request_cut_by_max_tokens_ends_with_length_and_a_prefix_of_its_json(http):
    """The documented behaviour: max_tokens wins over the grammar; the text is a valid prefix, not valid JSON."""
    schema = SCHEMAS["array-of-objects"]
    full = completion(http, max_tokens=200, temperature=0.0, response_format={
        "type": "json_schema", "json_schema": {"name": "order", "schema": schema}})
    cut = completion(http, max_tokens=8, temperature=0.0, response_format={
        "type": "json_schema", "json_schema": {"name": "order", "schema": schema}})
    assert full["finish_reason"] == "stop" and cut["finish_reason"] == "length"
    assert full["text"].startswith(cut["text"]) and len(cut["text"]) < len(full["text"])


class Weather(BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    celsius: int = Field(ge=-40, le=50)
    rain: bool
    hourly: list[int] = Field(max_length=3)


class Forecast(BaseModel):
    days: list[Weather] = Field(min_length=1, max_length=2)
    unit: Literal["C"]


def test_openai_client_parse_returns_the_pydantic_object(so_server):
    client = openai.OpenAI(base_url=so_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for seed in range(3):
        resp = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "Forecast?"}],
                                             response_format=Forecast, max_tokens=300, temperature=1.0, seed=seed)
        parsed = resp.choices[0].message.parsed
        assert isinstance(parsed, Forecast) and all(isinstance(d, Weather) for d in parsed.days)
        assert resp.choices[0].finish_reason == "stop"


def test_the_default_allows_whitespace_and_stays_valid(server):
    """The shared server keeps vLLM's default (any whitespace between JSON tokens)."""
    schema = SCHEMAS["enums"]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        texts = []
        for seed in range(6):
            resp = client.post("/v1/completions", json={"model": server.model, "prompt": "x", "max_tokens": 150,
                                                        "temperature": 1.0, "seed": seed,
                                                        "structured_outputs": {"json": schema}})
            choice = resp.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                texts.append(choice["text"])
                jsonschema.validate(json.loads(choice["text"]), schema)
        assert texts and any(re.search(r"\s", t.replace(", ", "").replace(": ", "")) for t in texts)


def test_streamed_constrained_text_equals_the_unstreamed_text(http):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 120, "temperature": 1.0, "seed": 5,
            "structured_outputs": {"json": SCHEMAS["refs-and-defs"]}}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    text = ""
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert text == whole
    jsonschema.validate(json.loads(text), SCHEMAS["refs-and-defs"])
