"""The official `openai` client against a real uvicorn server: what users of the OpenAI API run."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def hf_greedy_text(hf_model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> str:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=0)
    # A trailing incomplete UTF-8 sequence is held back by the server's detokeniser; compare what is complete.
    return tokenizer.decode(out[0, len(prompt_ids):].tolist()).rstrip("\ufffd")


def test_greedy_completion_matches_hf_transformers(client, server, tokenizer, hf_model):
    resp = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    prompt_ids = tokenizer.encode(PROMPT)
    assert resp.choices[0].text.rstrip("\ufffd") == hf_greedy_text(hf_model, tokenizer, prompt_ids, 12)
    assert resp.choices[0].finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(prompt_ids), 12)


def test_chat_completion_renders_the_checkpoint_chat_template(client, server, tokenizer, hf_model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    resp = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    assert resp.usage.prompt_tokens == len(prompt_ids)
    assert resp.usage.completion_tokens == 10
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content.rstrip("\ufffd") == hf_greedy_text(hf_model, tokenizer, prompt_ids, 10)


def test_streamed_completion_concatenates_to_the_unstreamed_text(client, server):
    kwargs = dict(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_chat_opens_with_the_role_and_ends_with_usage(client, server):
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) == \
        whole.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})


def test_n_2_returns_two_indexed_choices_counted_in_usage(client, server):
    resp = client.completions.create(model=server.model, prompt=PROMPT, n=2, max_tokens=8, temperature=1.0, seed=3,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert resp.choices[0].text != resp.choices[1].text  # two independent samples
    assert resp.usage.completion_tokens == 16


def test_streamed_n_2_chat_delivers_both_choices(client, server):
    chunks = list(client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=6, seed=1, stream=True,
        extra_body={"ignore_eos": True}))
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason}
    assert finished == {0: "length", 1: "length"}


def test_stop_string_ends_the_text_before_it(client, server):
    kwargs = dict(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    stop = next(ch for ch in full[3:] if ch != "\ufffd")  # a character the greedy text reaches later on
    resp = client.completions.create(stop=[stop], **kwargs)
    assert resp.choices[0].text == full[:full.index(stop)]
    assert resp.choices[0].finish_reason == "stop"


def test_same_seed_gives_the_same_sample_and_another_seed_does_not(client, server):
    kwargs = dict(model=server.model, prompt=PROMPT, max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
    first = client.completions.create(seed=1234, **kwargs).choices[0].text
    again = client.completions.create(seed=1234, **kwargs).choices[0].text
    other = client.completions.create(seed=4321, **kwargs).choices[0].text
    assert first == again
    assert first != other


def test_chat_logprobs_list_the_top_alternatives_most_likely_first(client, server):
    resp = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    content = resp.choices[0].logprobs.content
    assert len(content) == 5
    for token in content:
        values = [alt.logprob for alt in token.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert token.logprob == pytest.approx(values[0])  # greedy picks the most likely token


def test_completion_logprobs_cover_every_token(client, server):
    resp = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(value <= 0.0 for value in lp.token_logprobs)


def test_models_lists_the_served_name(client, server):
    assert [m.id for m in client.models.list().data] == [server.model]


def test_unknown_model_is_a_not_found_error(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
