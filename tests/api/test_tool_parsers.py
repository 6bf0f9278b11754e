"""Turning generated text into tool calls: however the text is split into stream chunks, the deltas add up to
the non-streamed message (which is built by the same parser)."""

from __future__ import annotations

import json

import pytest

from railyard.api.output_parsers import ParsedMessage, ThinkThenTools, parse_message, stream_delta
from railyard.api.tool_parsers import HermesParser, NamedParser, RequiredParser, ToolCallParser

HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
          '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


def parse(parser: ToolCallParser, text: str) -> ParsedMessage:
    """The whole message, as the chat endpoint builds it for a model without a reasoning parser."""
    return parse_message(ThinkThenTools(tools=parser), text)


def streamed(parser: ToolCallParser, chunks: list[str]) -> tuple[str, list[dict]]:
    """Content and calls reassembled from the stream's deltas, as an OpenAI client does."""
    content, calls = "", {}
    choice = ThinkThenTools(tools=parser)
    for i, chunk in enumerate(chunks):
        delta = stream_delta(choice, chunk, last=i == len(chunks) - 1)
        content += delta.get("content", "")
        for d in delta.get("tool_calls", []):
            call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in d:
                assert call["id"] is None, "an id is sent once, in the call's first delta"
                call["id"], call["name"] = d["id"], d["function"]["name"]
            call["arguments"] += d["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)]


def splits(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and cut at every position into two chunks."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


def test_hermes_blocks_become_calls_and_the_text_before_them_content():
    message = parse(HermesParser(), HERMES)
    assert message.content == "Let me check.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "CET"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message.tool_calls)
    assert len({c["id"] for c in message.tool_calls}) == 2


def test_hermes_streamed_in_any_chunks_equals_the_whole_message():
    whole = parse(HermesParser(), HERMES)
    for chunks in splits(HERMES):
        content, calls = streamed(HermesParser(), chunks)
        assert content == whole.content
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls]


@pytest.mark.parametrize("text, content, names", [
    ("no tools here", "no tools here", []),
    ("a < b and <tool", "a < b and <tool", []),  # a held-back prefix of <tool_call> is content after all
    ('<tool_call>{"name": "f", "arguments": {}}', None, ["f"]),  # the model ended without </tool_call>
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ('<tool_call>{"name": "f", "arguments": {}', "<tool_call>" + '{"name": "f", "arguments": {}', []),
])
def test_hermes_edge_cases(text, content, names):
    message = parse(HermesParser(), text)
    assert message.content == content
    assert [c["function"]["name"] for c in message.tool_calls] == names
    for chunks in splits(text):
        streamed_content, calls = streamed(HermesParser(), chunks)
        assert streamed_content == (content or "") and [c["name"] for c in calls] == names


def test_required_array_items_become_calls_as_each_closes():
    text = '[{"name": "f", "parameters": {"s": "a]}\\"["}}, {"name": "g", "parameters": {}}]'
    parser = RequiredParser()
    assert parser.feed(text[:40]) == ("", [])  # inside the first item
    message = parse(RequiredParser(), text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.tool_calls] == [
        ("f", {"s": 'a]}"['}), ("g", {})]
    assert message.content is None
    for chunks in splits(text):
        assert [(c["name"], c["arguments"]) for c in streamed(RequiredParser(), chunks)[1]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in message.tool_calls]


def test_a_required_array_cut_before_any_item_closed_is_content():
    assert parse(RequiredParser(), '[{"name": "f", "param').content == '[{"name": "f", "param'


def test_named_text_is_the_arguments_streamed_as_they_come():
    text = '{"city": "Oslo"}'
    message = parse(NamedParser(name="get_weather"), text)
    assert message.content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.tool_calls] == [("get_weather", text)]
    content, calls = streamed(NamedParser(name="get_weather"), list(text))
    assert content == "" and [(c["name"], c["arguments"]) for c in calls] == [("get_weather", text)]
