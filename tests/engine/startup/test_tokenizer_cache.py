"""A loaded tokenizer is kept in railyard's cache: the next load of the same files unpickles AutoTokenizer's own
result (without importing AutoTokenizer, its model registry or torch); changed files make a new entry, and an
entry that does not load, or a cache that cannot be written, costs only the time the cache would have saved."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from railyard.engine.startup import tokenizer_cache
from railyard.engine.tokenizer import load_tokenizer


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "railyard-cache"
    monkeypatch.setenv("RAILYARD_CACHE", str(root))
    return root / "tokenizers"


@pytest.fixture
def tokenizer_dir(tiny_model, tmp_path) -> Path:
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(Path(tiny_model) / name, d)
    return d


def _same(a, b) -> None:
    text = "Hello wörld <|im_end|> 123"
    messages = [{"role": "user", "content": "Hi!"}]
    assert type(a) is type(b)
    assert a.encode(text) == b.encode(text) and a.decode(a.encode(text)) == b.decode(b.encode(text))
    assert a.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        b.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (a.eos_token_id, a.all_special_ids, a.truncation_side) == (b.eos_token_id, b.all_special_ids, "left")


def test_the_second_load_comes_from_the_cache_and_is_what_autotokenizer_gives(cache, tokenizer_dir):
    first = load_tokenizer(tokenizer_dir)
    entries = list(cache.glob("*.pkl"))
    assert len(entries) == 1
    second = load_tokenizer(tokenizer_dir)
    assert second is not first
    _same(second, AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, truncation_side="left"))
    assert list(cache.glob("*.pkl")) == entries


def test_a_cache_hit_imports_neither_autotokenizer_nor_torch(cache, tokenizer_dir):
    load_tokenizer(tokenizer_dir)
    probe = ("import sys; from railyard.engine.tokenizer import load_tokenizer; "
             f"tok = load_tokenizer({str(tokenizer_dir)!r}); print(type(tok).__name__, 'torch' in sys.modules, "
             "'transformers.models.auto.tokenization_auto' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ)).stdout.split()
    assert out[1:] == ["False", "False"], out


def test_a_changed_tokenizer_file_makes_a_new_entry(cache, tokenizer_dir):
    before = load_tokenizer(tokenizer_dir)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    after = load_tokenizer(tokenizer_dir)
    assert after.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
    assert before.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) != "[x]"
    assert len(list(cache.glob("*.pkl"))) == 2


def test_an_entry_that_does_not_load_is_replaced(cache, tokenizer_dir, caplog):
    load_tokenizer(tokenizer_dir)
    (entry,) = cache.glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING, logger="railyard.engine"):
        tokenizer = load_tokenizer(tokenizer_dir)
    assert "does not load" in caplog.text
    _same(tokenizer, AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, truncation_side="left"))
    assert tokenizer_cache.load_cached(entry.stem) is not None  # written again


def test_a_cache_that_cannot_be_written_costs_only_the_cache(tmp_path, monkeypatch, tokenizer_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RAILYARD_CACHE", str(blocker))  # its tokenizers/ can never be made
    _same(load_tokenizer(tokenizer_dir),
          AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, truncation_side="left"))
    assert not list(tmp_path.glob("**/*.tmp"))


def test_the_same_files_in_another_directory_have_their_own_entry(cache, tokenizer_dir, tmp_path):
    """A cached tokenizer remembers its directory (name_or_path): a copy elsewhere is not served another's."""
    copy = tmp_path / "copy"
    shutil.copytree(tokenizer_dir, copy)
    assert load_tokenizer(tokenizer_dir).name_or_path == str(tokenizer_dir)
    assert load_tokenizer(copy).name_or_path == str(copy)
    assert load_tokenizer(copy).name_or_path == str(copy)  # from the cache
    assert len(list(cache.glob("*.pkl"))) == 2


def test_the_least_recently_used_entries_beyond_the_cap_are_removed(cache, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_cache, "MAX_ENTRIES", 2)
    dirs = []
    for i in range(3):
        d = tmp_path / f"copy{i}"
        shutil.copytree(tokenizer_dir, d)
        dirs.append(d)
    entries = []  # each directory's entry, in the order they were made
    for d in dirs[:2]:
        before = set(cache.glob("*.pkl"))
        load_tokenizer(d)
        (made,) = set(cache.glob("*.pkl")) - before
        entries.append(made)
    os.utime(entries[0], (1, 1))  # dirs[0]'s: long unused
    load_tokenizer(dirs[2])
    left = set(cache.glob("*.pkl"))
    assert len(left) == 2 and entries[1] in left and entries[0] not in left
