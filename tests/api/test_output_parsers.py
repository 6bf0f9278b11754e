"""Reasoning, content and tool calls from a choice's text: however the text is split into stream chunks, the
deltas add up to the non-streamed message; harmony's messages (gpt-oss) and `<think>` blocks (Qwen3) as vLLM
reads them; the parsers picked by name or by the chat template."""

from __future__ import annotations

import json

import pytest

from railyard.api.harmony import HarmonyParser
from railyard.api.output_parsers import ParserNames, ThinkThenTools, parse_message, resolve_parsers, stream_delta
from railyard.api.reasoning import ThinkParser, prompt_opens_thinking
from railyard.api.tool_parsers import HermesParser

ANALYSIS = "<|channel|>analysis<|message|>The user wants Paris's weather.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."


def streamed(make, chunks: list[str]) -> tuple[str, str, list[dict]]:
    """Reasoning, content and calls reassembled from the stream's deltas, as an OpenAI client does; checks
    that a call's id and name come once, in its first piece, and that no chunk holds two pieces of one call."""
    parser, reasoning, content, calls = make(), "", "", {}
    for i, chunk in enumerate(chunks):
        delta = stream_delta(parser, chunk, last=i == len(chunks) - 1)
        assert delta.get("reasoning") == delta.get("reasoning_content")
        reasoning += delta.get("reasoning_content", "")
        content += delta.get("content", "")
        pieces = delta.get("tool_calls", [])
        assert len({d["index"] for d in pieces}) == len(pieces)
        for d in pieces:
            call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
            assert ("id" in d) == (call["id"] is None), "an id is sent once, in the call's first piece"
            if "id" in d:
                call["id"], call["name"] = d["id"], d["function"]["name"]
            call["arguments"] += d["function"]["arguments"]
    return reasoning, content, [calls[i] for i in sorted(calls)]


def assert_streams_like_whole(make, text: str) -> None:
    whole = parse_message(make(), text)
    expected = (whole.reasoning or "", whole.content or "",
                [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls])
    cuts = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for chunks in cuts:
        reasoning, content, calls = streamed(make, chunks)
        assert (reasoning, content, [(c["name"], c["arguments"]) for c in calls]) == expected, chunks


# --- harmony (gpt-oss)

def test_harmony_analysis_is_reasoning_and_final_is_content():
    message = parse_message(HarmonyParser(), ANALYSIS + FINAL)
    assert (message.reasoning, message.content, message.tool_calls) == (
        "The user wants Paris's weather.", "It is sunny in Paris.", [])


@pytest.mark.parametrize("header", [
    "<|channel|>commentary to=functions.get_weather <|constrain|>json",
    " to=functions.get_weather<|channel|>commentary json",  # the recipient before the channel, as templates write it
    "<|channel|>commentary to=functions.get_weather json",
])
def test_harmony_a_message_to_a_function_is_a_call_whichever_way_its_header_is_written(header):
    message = parse_message(HarmonyParser(), header + '<|message|>{"city": "Oslo"}')
    assert message.content is None and message.reasoning is None
    [call] = message.tool_calls
    assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_harmony_calls_after_calls_get_their_own_index_when_call_does_not_end_the_output():
    text = ANALYSIS + CALL + "<|call|>" + CALL.replace("Paris", "Lima")
    message = parse_message(HarmonyParser(), text)
    assert [json.loads(c["function"]["arguments"])["city"] for c in message.tool_calls] == ["Paris", "Lima"]
    assert len({c["id"] for c in message.tool_calls}) == 2


@pytest.mark.parametrize("text", [ANALYSIS + FINAL, ANALYSIS + CALL, ANALYSIS + CALL + "<|call|>" + CALL,
                                  "<|channel|>commentary<|message|>Checking.<|end|>" + CALL])
def test_harmony_streamed_in_any_chunks_equals_the_whole_message(text):
    assert_streams_like_whole(HarmonyParser, text)


def test_harmony_a_preamble_in_commentary_is_content_and_builtin_tool_calls_are_reasoning():
    text = ("<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>" + CALL)
    message = parse_message(HarmonyParser(), text)
    assert message.reasoning == '{"query": "x"}' and message.content == "Let me check."
    assert [c["function"]["name"] for c in message.tool_calls] == ["get_weather"]


def test_harmony_without_tools_a_call_body_is_content():
    message = parse_message(HarmonyParser(tools=False), ANALYSIS + CALL)
    assert message.tool_calls == [] and message.content == '{"city": "Paris"}'


@pytest.mark.parametrize("text, reasoning, content", [
    ("plain text, no harmony", None, "plain text, no harmony"),
    (ANALYSIS + "<|start|>assistant<|chan", "The user wants Paris's weather.", ""),  # cut inside a header
    ("<|channel|>final<|message|>1 <| 2 <|en", None, "1 <| 2 <|en"),  # cut where a marker may have begun
])
def test_harmony_output_cut_short_or_not_harmony(text, reasoning, content):
    message = parse_message(HarmonyParser(), text)
    assert (message.reasoning, message.content, message.tool_calls) == (reasoning, content, [])


# --- <think> blocks (Qwen3)

@pytest.mark.parametrize("opened, text, reasoning, content", [
    (False, "<think>\nThe user greets.\n</think>\n\nHello!", "\nThe user greets.\n", "\n\nHello!"),
    (False, "Hello, no thinking.", None, "Hello, no thinking."),
    (False, "<thi", None, "<thi"),  # a lone beginning of <think> is content after all
    (False, "<think>cut while thinking", "cut while thinking", ""),
    (False, "Answer <think>later</think>", None, "Answer <think>later</think>"),  # a block opens only at the start
    (True, "The template opened it.</think>\n\nHi", "The template opened it.", "\n\nHi"),
])
def test_think_blocks_are_reasoning(opened, text, reasoning, content):
    make = ThinkParser.opened if opened else ThinkParser
    message = parse_message(ThinkThenTools(make()), text)
    assert (message.reasoning, message.content) == (reasoning, content)
    assert_streams_like_whole(lambda: ThinkThenTools(make()), text)


def test_think_then_hermes_tool_calls():
    text = '<think>Need weather.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' \
           '</tool_call>'
    message = parse_message(ThinkThenTools(ThinkParser(), HermesParser()), text)
    assert message.reasoning == "Need weather." and message.content == "\n\n"
    assert [c["function"]["name"] for c in message.tool_calls] == ["get_weather"]
    assert_streams_like_whole(lambda: ThinkThenTools(ThinkParser(), HermesParser()), text)


@pytest.mark.parametrize("prompt, opened", [
    ("<|im_start|>assistant\n", False),
    ("<|im_start|>assistant\n<think>\n", True),  # Qwen3 2507 thinking models, R1 distills
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # enable_thinking false
])
def test_a_prompt_that_ends_inside_a_think_block_opens_the_output_in_it(prompt, opened):
    assert prompt_opens_thinking(prompt) is opened


# --- which parsers

@pytest.mark.parametrize("reasoning, tools, template, expected", [
    ("auto", "auto", "<|start|>assistant<|channel|>final<|message|>", ParserNames("openai_gptoss", "openai")),
    ("auto", "auto", "{{ '<think>\\n\\n</think>\\n\\n' }}", ParserNames("qwen3", "hermes")),
    ("auto", "auto", "<|im_start|>assistant\n", ParserNames(None, "hermes")),
    ("auto", "auto", None, ParserNames(None, "hermes")),
    ("none", "auto", "</think>", ParserNames(None, "hermes")),
    ("qwen3", "hermes", "", ParserNames("qwen3", "hermes")),
    ("openai_gptoss", "auto", "", ParserNames("openai_gptoss", "openai")),
    ("auto", "openai", "", ParserNames("openai_gptoss", "openai")),
    ("auto", "auto", {"default": "<|channel|>", "tool_use": "x"}, ParserNames("openai_gptoss", "openai")),
])
def test_parsers_are_picked_by_name_or_by_the_chat_template(reasoning, tools, template, expected):
    assert resolve_parsers(reasoning, tools, template) == expected
