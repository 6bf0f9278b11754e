"""gpt-oss's harmony format over HTTP with the official openai client, against real uvicorn and a real engine:
the conversation goes through the checkpoint's template (the oracle: transformers' apply_chat_template), and the
channels the model writes come back as reasoning_content, content and tool_calls, streamed or not.

The tiny random model is made to write what gpt-oss writes with a regex constraint (tests/api/chat_formats.py).
"""

from __future__ import annotations

import json

import openai
import pytest

from railyard.engine.tokenizer import load_tokenizer
from tests.api.chat_formats import assert_stream_reassembles_to, HARMONY_IDS, write_harmony_checkpoint
from tests.api.conftest import serve_in_thread, tiny_engine
from tests.api.test_tools import TOOLS

USER = [{"role": "user", "content": "Weather in Paris?"}]
ANSWER = r"<\|channel\|>analysis<\|message\|>The user greets me\.<\|end\|><\|start\|>assistant<\|channel\|>final" \
         r"<\|message\|>Hello there!"
# The two places gpt-oss writes a call's recipient: after the channel, and (as its template renders calls) before.
CALL_AFTER_CHANNEL = r"<\|channel\|>analysis<\|message\|>Need the weather\.<\|end\|><\|start\|>assistant" \
                     r"<\|channel\|>commentary to=functions\.get_weather <\|constrain\|>json<\|message\|>" \
                     r'\{"city": "(Paris|Oslo)", "days": [1-7]\}'
CALL_BEFORE_CHANNEL = r' to=functions\.get_weather<\|channel\|>commentary json<\|message\|>\{"city": "Lima", "days": 2\}'


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory):
    return write_harmony_checkpoint(tmp_path_factory.mktemp("tiny-harmony"))


@pytest.fixture(scope="module")
def client(harmony_model):
    engine = tiny_engine(str(harmony_model), max_model_len=2048, max_num_seqs=16)
    with serve_in_thread(engine) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def create(client, regex: str | None = None, **kwargs):
    kwargs.setdefault("max_tokens", 300)
    if regex is not None:
        kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "structured_outputs": {"regex": regex}}
    return client.chat.completions.create(model="tiny", messages=kwargs.pop("messages", USER), temperature=1.0,
                                          **kwargs)


def test_analysis_is_reasoning_content_and_final_is_content(client):
    resp = create(client, ANSWER, seed=1)
    message = resp.choices[0].message
    assert message.reasoning_content == "The user greets me." and message.content == "Hello there!"
    assert message.tool_calls is None and resp.choices[0].finish_reason == "stop"


def test_the_special_tokens_the_model_writes_are_read_though_a_default_detokenization_drops_them(client):
    resp = create(client, ANSWER, seed=1, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    written = {int(t.token.removeprefix("token_id:")) for t in resp.choices[0].logprobs.content}
    assert written & set(HARMONY_IDS.values()), "the grammar wrote no special token: pick another seed"
    assert resp.choices[0].message.content == "Hello there!"


@pytest.mark.parametrize("regex", [CALL_AFTER_CHANNEL, CALL_BEFORE_CHANNEL], ids=["after", "before"])
def test_a_commentary_message_to_a_function_is_a_tool_call(client, regex):
    resp = create(client, regex, tools=TOOLS, seed=3)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo", "Lima")
    if regex is CALL_AFTER_CHANNEL:
        assert choice.message.reasoning_content == "Need the weather."


@pytest.mark.parametrize("regex", [ANSWER, CALL_AFTER_CHANNEL], ids=["answer", "call"])
def test_streamed_deltas_reassemble_to_the_unstreamed_message(client, regex):
    whole = create(client, regex, tools=TOOLS, seed=5).choices[0]
    chunks = list(create(client, regex, tools=TOOLS, seed=5, stream=True))
    assert_stream_reassembles_to(whole, chunks)


def test_a_streamed_call_is_one_index_with_its_id_and_name_once(client):
    chunks = list(create(client, CALL_AFTER_CHANNEL, tools=TOOLS, seed=7, stream=True))
    pieces = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert len(pieces) > 1, "the arguments stream in pieces"
    assert {d.index for d in pieces} == {0}
    assert [bool(d.id) for d in pieces] == [True] + [False] * (len(pieces) - 1)
    assert [d.function.name for d in pieces if d.function.name] == ["get_weather"]
    for chunk in chunks:  # never two pieces of one call in one chunk (clients would take them for two calls)
        indices = [d.index for d in chunk.choices[0].delta.tool_calls or []] if chunk.choices else []
        assert len(indices) == len(set(indices))


def test_tool_choice_none_makes_no_calls(client):
    resp = create(client, CALL_BEFORE_CHANNEL, tools=TOOLS, tool_choice="none", seed=3)
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert json.loads(choice.message.content) == {"city": "Lima", "days": 2}


def test_required_and_named_tool_choice_are_refused_with_400(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError, match="harmony"):
            create(client, tools=TOOLS, tool_choice=choice, max_tokens=5)


def test_include_reasoning_false_leaves_the_analysis_out(client):
    message = create(client, ANSWER, seed=1, extra_body={"include_reasoning": False}).choices[0].message
    assert message.content == "Hello there!" and getattr(message, "reasoning_content", None) is None


def test_history_reasoning_calls_and_results_go_through_the_template(client, harmony_model):
    messages = [{"role": "system", "content": "Be brief."}, *USER,
                {"role": "assistant", "content": None, "reasoning_content": "Need the weather.",
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    resp = create(client, messages=messages, tools=TOOLS, max_tokens=1, reasoning_effort="low")
    # What the template gets: the call's arguments as an object, the reasoning where gpt-oss's template reads it.
    assistant = {**messages[2], "content": "", "thinking": "Need the weather.", "tool_calls": [{
        **messages[2]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]}
    tokenizer = load_tokenizer(harmony_model)
    text = tokenizer.apply_chat_template([*messages[:2], assistant, messages[3]], tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True, reasoning_effort="low")
    assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in text
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, 21 C"' in text
    assert "namespace functions {" in text and "Reasoning: low" in text and text.endswith("<|start|>assistant")
    assert resp.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
