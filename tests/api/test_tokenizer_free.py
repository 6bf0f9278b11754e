"""The server over a checkpoint without tokenizer files (Llama's layout here): token-id prompts are served,
tokens show as vLLM's 'token_id:N'; what needs a tokenizer (text prompts, chat, stop strings) is a 400."""

from __future__ import annotations

import httpx
import pytest

from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from tests.api.conftest import serve_in_thread, tiny_engine
from tests.engine.test_tokenizer_free import without_tokenizer


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    path = without_tokenizer(write_tiny_checkpoint(tmp_path_factory.mktemp("bare") / "llama", "llama"))
    with serve_in_thread(tiny_engine(path)) as running:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            yield client


def test_token_id_prompt_is_served_with_tokens_as_ids(bare):
    resp = bare.post("/v1/completions", json={"model": "tiny", "prompt": [5, 17, 99], "max_tokens": 4,
                                              "ignore_eos": True, "logprobs": 0, "temperature": 0})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert len(tokens) == 4 and all(t.startswith("token_id:") and int(t[9:]) < 259 for t in tokens)
    assert choice["text"] == ""  # nothing to decode with


@pytest.mark.parametrize("path,body,why", [
    ("/v1/completions", {"prompt": "hello"}, "send the prompt as token ids"),
    ("/v1/completions", {"prompt": [5, 6], "stop": ["x"]}, "use stop_token_ids"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "no chat template"),
], ids=["text prompt", "stop string", "chat"])
def test_what_needs_a_tokenizer_is_a_400_saying_what_to_do(bare, path, body, why):
    resp = bare.post(path, json={"model": "tiny", "max_tokens": 2, **body})
    assert resp.status_code == 400 and why in resp.json()["error"]["message"], resp.text
