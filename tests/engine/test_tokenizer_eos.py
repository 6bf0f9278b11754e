"""The engine core's EOS id from a tokenizer's files (LazyTokenizer.eos_token_id) is what transformers says
(AutoTokenizer's eos_token_id, the oracle), whether read plainly from the files or, where they are less plain,
by loading the tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from railyard.engine.tokenizer import LazyTokenizer


def _variant(tiny_model, tmp_path, config_change=None, special_tokens_map=None):
    shutil.copy(f"{tiny_model}/tokenizer.json", tmp_path)
    config = json.loads((Path(tiny_model) / "tokenizer_config.json").read_text())
    if config_change is not None:
        config_change(config)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if special_tokens_map is not None:
        (tmp_path / "special_tokens_map.json").write_text(json.dumps(special_tokens_map))
    return tmp_path


VARIANTS = {
    "a string": {},
    "an AddedToken": {"config_change": lambda c: c.update(eos_token={"content": "<|endoftext|>",
                                                                    "__type": "AddedToken"})},
    "a byte token": {"config_change": lambda c: c.update(eos_token="a")},
    "none": {"config_change": lambda c: c.pop("eos_token")},
    "one the vocabulary lacks": {"config_change": lambda c: c.update(eos_token="<|not-there|>")},
    "in special_tokens_map.json only": {"config_change": lambda c: c.pop("eos_token"),
                                        "special_tokens_map": {"eos_token": "<|endoftext|>"}},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_eos_id_is_transformers_eos_token_id(tiny_model, tmp_path, variant):
    path = _variant(tiny_model, tmp_path, **VARIANTS[variant])
    expected = AutoTokenizer.from_pretrained(str(path), local_files_only=True).eos_token_id
    assert LazyTokenizer(str(path)).eos_token_id() == expected


def test_a_plain_eos_is_read_without_loading_the_tokenizer(tiny_model):
    lazy = LazyTokenizer(tiny_model)
    assert lazy.eos_token_id() is not None and not lazy._loaded


def test_an_engine_without_a_tokenizer_has_no_eos_and_nothing_to_load():
    assert LazyTokenizer(None).eos_token_id() is None and LazyTokenizer(None).get() is None
