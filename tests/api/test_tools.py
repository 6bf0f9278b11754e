"""Tool calling over HTTP with the official openai client: tools and tool results rendered by the checkpoint's
chat template (the oracle: transformers' apply_chat_template), calls that always parse under "required" and
a named function, the Hermes parser under "auto", and streamed deltas that reassemble to the same calls."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
CONVERT = {"type": "function", "function": {
    "name": "convert", "parameters": {"type": "object", "properties": {
        "amount": {"type": "number", "minimum": 0, "maximum": 100},
        "unit": {"enum": ["km", "mi"]}}, "required": ["amount", "unit"]}}}
TOOLS = [WEATHER, CONVERT]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "Weather in Paris?"}]
# What a Qwen model writes when it calls a tool (forced here, since the tiny model's own text is gibberish).
HERMES_REGEX = (r'I will check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
                r'\{"city": "(Paris|Oslo|Lima)", "days": [1-7]\}\}\n</tool_call>')


@pytest.fixture(scope="module")
def client(structured_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=structured_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def create(client, **kwargs):
    kwargs.setdefault("max_tokens", 200)
    return client.chat.completions.create(model="tiny", messages=kwargs.pop("messages", USER), **kwargs)


def assert_valid_calls(calls) -> None:
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def reassemble(chunks) -> tuple[str, list[dict], str | None]:
    """Content, tool calls and finish reason from a stream, merged by call index as OpenAI clients do."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    call["id"], call["name"] = d.id, d.function.name
                call["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_tools_and_tool_results_go_through_the_chat_template(client, tokenizer):
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    resp = create(client, messages=messages, tools=TOOLS, max_tokens=1)
    # transformers' convention: a call's arguments are an object (OpenAI clients send JSON text)
    expected = [*messages[:1], {**messages[1], "content": "", "tool_calls": [{**messages[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]}, messages[2]]
    text = tokenizer.apply_chat_template(expected, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and '"arguments": {"city": "Paris", "days": 1}' in text and "sunny, 21 C" in text
    assert resp.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))


def test_required_gives_calls_that_parse_with_ids_and_finish_reason_tool_calls(client):
    for seed in range(4):
        resp = create(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                      seed=seed)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        assert_valid_calls(choice.message.tool_calls)


def test_required_with_parallel_calls_gives_one_or_more_valid_calls(client):
    resp = create(client, tools=TOOLS, tool_choice="required", temperature=1.0, seed=3, max_tokens=400)
    calls = resp.choices[0].message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    assert_valid_calls(calls)


def test_a_named_function_is_called_with_valid_arguments(client):
    for seed in range(3):
        resp = create(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "convert"}},
                      temperature=1.0, seed=seed)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls] == ["convert"]
        assert_valid_calls(choice.message.tool_calls)


def test_auto_parses_hermes_tool_call_blocks(client):
    resp = create(client, tools=TOOLS, tool_choice="auto", temperature=1.0, seed=2,
                  extra_body={"structured_outputs": {"regex": HERMES_REGEX}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check.\n"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert_valid_calls(choice.message.tool_calls)


def test_auto_without_a_call_is_plain_content_and_none_parses_nothing(client):
    plain = create(client, tools=TOOLS, temperature=0.0, max_tokens=20, extra_body={"ignore_eos": True})
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason == "length"
    none = create(client, tools=TOOLS, tool_choice="none", temperature=1.0, seed=2,
                  extra_body={"structured_outputs": {"regex": HERMES_REGEX}})
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"
    assert "<tool_call>" in none.choices[0].message.content


@pytest.mark.parametrize("mode", ["required", "named", "auto"])
def test_streamed_tool_call_deltas_reassemble_to_the_unstreamed_calls(client, mode):
    kwargs = {"required": dict(tool_choice="required"),
              "named": dict(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
              "auto": dict(tool_choice="auto", extra_body={"structured_outputs": {"regex": HERMES_REGEX}})}[mode]
    kwargs.update(tools=TOOLS, temperature=1.0, seed=7, max_tokens=400)
    whole = create(client, **kwargs).choices[0]
    content, calls, finish = reassemble(create(client, stream=True, **kwargs))
    assert finish == whole.finish_reason
    assert content == (whole.message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_each_of_n_choices_gets_its_own_calls(client):
    resp = create(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  n=3, temperature=1.0, seed=11)
    assert len(resp.choices) == 3
    for choice in resp.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        assert_valid_calls(choice.message.tool_calls)
