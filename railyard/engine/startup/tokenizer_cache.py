"""Loaded HF tokenizers kept in railyard's cache (caches.py): `tokenizers/<key>.pkl`, the object AutoTokenizer
made, pickled.

Why: `from transformers import AutoTokenizer` imports transformers' model registry with it (modeling_auto,
generation, and through them torch, sympy and, where installed, scikit-learn): seconds, enough to keep a warm
server's front busy after its engine is ready (scripts/dev/startup-profile.sh). Unpickling imports only the
tokenizer's own class module.
AutoTokenizer's choice of class depends on the files and on the transformers version in ways that are not ours
to copy, so the cache keeps its result instead of second-guessing it.

The key hashes the directory's path and its tokenizer files (every small text file: tokenizer.json, its configs,
chat templates, config.json, which AutoTokenizer also reads) with the Python, transformers and tokenizers
versions, so a changed file or an upgrade makes a new entry; beyond MAX_ENTRIES the least recently used go. An
entry that fails to load is removed and the tokenizer loaded again. Pickle runs code from the file: the cache is
as trusted as its directory, like Triton's compiled kernels beside it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from railyard.envs import cache_root

log = logging.getLogger("railyard.engine")

FORMAT = 1  # bumped when what an entry holds changes
_KEYED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")  # the files a tokenizer is made from
_MAX_KEYED_BYTES = 64 << 20  # a text file this large is not a tokenizer's
MAX_ENTRIES = 32  # the least recently used beyond this are removed (each directory and version has its own)


def cache_dir() -> Path:
    return cache_root() / "tokenizers"


def cache_key(path: Path, options: dict[str, Any]) -> str | None:
    """The entry name for the tokenizer in directory `path` loaded with `options` (from_pretrained keywords);
    None where there is none to cache: not a local directory, or files that cannot be read here."""
    if not path.is_dir():
        return None
    h = hashlib.sha256(f"railyard-tokenizer-{FORMAT};python={sys.version_info[:2]};".encode())
    for package in ("transformers", "tokenizers"):
        try:
            h.update(f"{package}={version(package)};".encode())
        except PackageNotFoundError:
            h.update(f"{package}=none;".encode())
    h.update(repr(sorted(options.items())).encode())
    try:
        h.update(str(path.resolve()).encode() + b"\0")  # the object remembers its directory (name_or_path)
        for file in sorted(path.iterdir()):
            if file.suffix in _KEYED_SUFFIXES and file.is_file() and file.stat().st_size <= _MAX_KEYED_BYTES:
                h.update(file.name.encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    except OSError:
        return None
    return h.hexdigest()[:32]


def load_cached(key: str) -> Any | None:
    """The cached tokenizer of `key`, or None (no entry, or one that failed to load: then it is removed)."""
    entry = cache_dir() / f"{key}.pkl"
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    try:
        tokenizer = pickle.loads(data)
    except Exception as exc:  # a truncated or stale entry: load the tokenizer again, and replace it
        log.warning("tokenizer cache entry %s does not load (%s: %s); loading the tokenizer instead", entry,
                    type(exc).__name__, exc)
        entry.unlink(missing_ok=True)
        return None
    try:
        os.utime(entry)  # recently used: the last to be evicted
    except OSError:
        pass
    return tokenizer


def store(key: str, tokenizer: Any) -> None:
    """Keep `tokenizer` under `key`; written to a temporary file and renamed, so a reader never sees half an
    entry. Anything that stops it (a read-only cache, an object pickle cannot take) only costs the next start."""
    directory = cache_dir()
    tmp = None
    try:
        data = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, directory / f"{key}.pkl")
        _evict(directory)
    except Exception as exc:
        log.info("tokenizer not cached (%s: %s)", type(exc).__name__, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _evict(directory: Path) -> None:
    """Remove the least recently used entries beyond MAX_ENTRIES (a checkpoint directory that is gone, or an
    old transformers', keeps its entry until then)."""
    def last_used(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except OSError:  # removed meanwhile (another process evicting)
            return 0.0

    for old in sorted(directory.glob("*.pkl"), key=last_used, reverse=True)[MAX_ENTRIES:]:
        old.unlink(missing_ok=True)
