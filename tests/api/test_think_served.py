"""Qwen3's `<think>` blocks over HTTP with the official openai client, against real uvicorn and a real engine:
the block is reasoning_content, the rest content (or tool calls), streamed or not; `chat_template_kwargs:
{"enable_thinking": false}` reaches the template and leaves everything content, as in vLLM.

The tiny random model is made to write what Qwen3 writes with a regex constraint (tests/api/chat_formats.py).
"""

from __future__ import annotations

import json

import openai
import pytest

from railyard.engine.tokenizer import load_tokenizer
from tests.api.chat_formats import assert_stream_reassembles_to, write_think_checkpoint
from tests.api.conftest import serve_in_thread, tiny_engine
from tests.api.test_tools import TOOLS, reassemble

USER = [{"role": "user", "content": "Hi!"}]
THOUGHT = r"<think>\nThe user greets me\.\n</think>\n\nHello!"
THOUGHT_THEN_CALL = r'<think>\nNeed the weather\.\n</think>\n\n<tool_call>\n\{"name": "get_weather", ' \
                    r'"arguments": \{"city": "Oslo", "days": 2\}\}\n</tool_call>'


@pytest.fixture(scope="module")
def think_model(tmp_path_factory):
    return write_think_checkpoint(tmp_path_factory.mktemp("tiny-think"))


@pytest.fixture(scope="module")
def client(think_model):
    engine = tiny_engine(str(think_model), max_model_len=2048, max_num_seqs=16,
                         structured_outputs_disable_any_whitespace=True)
    with serve_in_thread(engine) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def create(client, regex: str | None, **kwargs):
    extra = {**kwargs.pop("extra_body", {}), **({"structured_outputs": {"regex": regex}} if regex else {})}
    return client.chat.completions.create(model="tiny", messages=kwargs.pop("messages", USER), temperature=1.0,
                                          seed=1, max_tokens=300, extra_body=extra, **kwargs)


def test_the_think_block_is_reasoning_content(client):
    message = create(client, THOUGHT).choices[0].message
    assert message.reasoning_content == "\nThe user greets me.\n" and message.content == "\n\nHello!"
    assert message.reasoning == message.reasoning_content  # vLLM's current name for it


def test_thinking_switched_off_reaches_the_template_and_leaves_all_content(client, think_model):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    resp = create(client, THOUGHT, extra_body=off)
    assert getattr(resp.choices[0].message, "reasoning_content", None) is None
    assert resp.choices[0].message.content == "<think>\nThe user greets me.\n</think>\n\nHello!"
    tokenizer = load_tokenizer(think_model)
    text = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n")
    assert resp.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))


def test_a_block_the_template_opened_in_the_prompt_makes_the_output_start_as_reasoning(client):
    resp = create(client, r"The user greets me\.</think>\n\nHello!",
                  extra_body={"chat_template_kwargs": {"think_in_prompt": True}})
    message = resp.choices[0].message
    assert message.reasoning_content == "The user greets me." and message.content == "\n\nHello!"


def test_json_asked_for_is_the_answer_even_where_the_prompt_opened_a_block(client):
    schema = {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"], "additionalProperties": False}
    resp = create(client, None, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                  extra_body={"chat_template_kwargs": {"think_in_prompt": True}})
    message = resp.choices[0].message
    assert json.loads(message.content) == {"a": "x"} and getattr(message, "reasoning_content", None) is None


def test_reasoning_then_a_tool_call(client):
    choice = create(client, THOUGHT_THEN_CALL, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning_content == "\nNeed the weather.\n"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == \
        [("get_weather", '{"city": "Oslo", "days": 2}')]


@pytest.mark.parametrize("regex", [THOUGHT, THOUGHT_THEN_CALL], ids=["answer", "call"])
def test_streamed_deltas_reassemble_to_the_unstreamed_message(client, regex):
    whole = create(client, regex, tools=TOOLS).choices[0]
    chunks = list(create(client, regex, tools=TOOLS, stream=True))
    assert_stream_reassembles_to(whole, chunks)


def test_include_reasoning_false_leaves_the_reasoning_out_streamed_or_not(client):
    no = {"include_reasoning": False}
    message = create(client, THOUGHT, extra_body=no).choices[0].message
    assert message.content == "\n\nHello!" and getattr(message, "reasoning_content", None) is None
    chunks = list(create(client, THOUGHT, extra_body=no, stream=True))
    assert reassemble(chunks)[0] == "\n\nHello!"
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices)
