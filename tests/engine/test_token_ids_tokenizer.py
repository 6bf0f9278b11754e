"""The tokenizer of a front that is sent token ids (an engine replica behind railyard's ingress): tokenizer.json read
by `tokenizers` alone, detokenizing as the HF tokenizer does, refusing text, and loaded without transformers (which
in some versions imports torch with any tokenizer: seconds before a replica added for a burst can serve).
Oracle: the checkpoint's HF tokenizer (transformers' AutoTokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from railyard.engine.startup.tiny_model import ensure_tiny_model, write_tiny_checkpoint
from railyard.engine.tokenizer import (TokenIdsTokenizer, load_token_ids_tokenizer, load_tokenizer,
                                       make_detokenizer)
from railyard.errors import InvalidRequestError

TEXT = "Héllo, wörld! 日本語 🚀 <|im_start|>tool<|im_end|> done<|endoftext|>"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("ids-tokenizer") / "qwen2", "qwen2"))


def _copy_of_the_tiny_tokenizer(directory) -> dict:
    """The embedded model's tokenizer files in `directory`; returns its tokenizer_config.json to edit."""
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (directory / name).write_bytes((ensure_tiny_model() / name).read_bytes())
    return json.loads((directory / "tokenizer_config.json").read_text())


def _write_config(directory, config: dict) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def _stream(tokenizer, prompt_ids: list[int], output_ids: list[int], skip: bool) -> list[str]:
    detok = make_detokenizer(tokenizer, prompt_ids, skip_special_tokens=skip)
    return [detok.append(i) for i in output_ids]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_it_streams_each_outputs_text_as_the_hf_tokenizer_does(checkpoint, skip_special_tokens):
    hf = load_tokenizer(checkpoint)
    ids = load_token_ids_tokenizer(checkpoint)
    assert isinstance(ids, TokenIdsTokenizer)
    token_ids = hf.encode(TEXT, add_special_tokens=False)
    prompt, output = token_ids[:7], token_ids[7:]
    assert _stream(ids, prompt, output, skip_special_tokens) == _stream(hf, prompt, output, skip_special_tokens)
    assert ids.decode(token_ids, skip_special_tokens) == hf.decode(token_ids, skip_special_tokens=skip_special_tokens)


def test_text_is_refused_with_a_client_error(checkpoint):
    with pytest.raises(InvalidRequestError, match="takes token ids"):
        load_token_ids_tokenizer(checkpoint).encode("hello")


def test_a_token_the_config_calls_special_but_tokenizer_json_does_not_gets_the_hf_tokenizer(tmp_path):
    """Skipping special tokens would otherwise keep a token the HF tokenizer skips."""
    config = _copy_of_the_tiny_tokenizer(tmp_path)
    config["additional_special_tokens"] = ["hello"]
    _write_config(tmp_path, config)
    assert not isinstance(load_token_ids_tokenizer(tmp_path), TokenIdsTokenizer)


def test_a_config_listing_the_added_tokens_tokenizer_json_holds_keeps_the_token_ids_tokenizer(tmp_path):
    """As transformers saves a tokenizer: tokenizer_config.json lists every added token by id."""
    config = _copy_of_the_tiny_tokenizer(tmp_path)
    added = json.loads((tmp_path / "tokenizer.json").read_text())["added_tokens"]
    config["added_tokens_decoder"] = {str(t["id"]): {"content": t["content"], "special": True} for t in added}
    _write_config(tmp_path, config)
    assert isinstance(load_token_ids_tokenizer(tmp_path), TokenIdsTokenizer)


def test_an_added_token_tokenizer_json_lacks_gets_the_hf_tokenizer(tmp_path):
    """The HF tokenizer adds tokenizer_config.json's added tokens to its backend: tokenizer.json alone would decode
    those ids otherwise."""
    config = _copy_of_the_tiny_tokenizer(tmp_path)
    config["added_tokens_decoder"] = {"300": {"content": "<think>", "special": False}}
    _write_config(tmp_path, config)
    assert not isinstance(load_token_ids_tokenizer(tmp_path), TokenIdsTokenizer)


def test_it_loads_without_importing_transformers():
    script = ("import sys; from railyard.engine.tokenizer import load_token_ids_tokenizer; "
              f"t = load_token_ids_tokenizer({str(ensure_tiny_model())!r}); "
              "print(type(t).__name__, 'transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["TokenIdsTokenizer", "False", "False"]
