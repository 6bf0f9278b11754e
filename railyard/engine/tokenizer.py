"""Tokenizer loading (HF tokenizers from the checkpoint dir) and incremental detokenisation."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from railyard.engine.startup import tokenizer_cache
from railyard.errors import InvalidRequestError, ModelLoadError

log = logging.getLogger("railyard.engine")

# What an HF tokenizer is made from: without any of these a checkpoint has no tokenizer at all.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "merges.txt", "spiece.model", "special_tokens_map.json")


def has_tokenizer_files(path: str | Path) -> bool:
    path = Path(path)
    return any((path / name).is_file() for name in _TOKENIZER_FILES) or any(path.glob("*.tiktoken"))


def load_tokenizer(path: str | Path):
    """The checkpoint's own HF tokenizer (tokenizer.json / tokenizer_config.json), local files only, or None
    for a directory with no tokenizer files: then the model serves token-id prompts only, for every
    architecture alike (vLLM's skip_tokenizer_init). Truncation (truncate_prompt_tokens) keeps a prompt's end.
    AutoTokenizer's result is kept in railyard's cache (tokenizer_cache.py: seconds of imports saved per start)."""
    if Path(path).is_dir() and not has_tokenizer_files(path):
        log.warning("%s has no tokenizer files: serving token-id prompts only (text prompts get 400)", path)
        return None
    options = {"truncation_side": "left"}
    key = tokenizer_cache.cache_key(Path(path), options)
    if key is not None and (cached := tokenizer_cache.load_cached(key)) is not None:
        return cached
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, **options)
    except Exception as exc:  # transformers raises many types for a broken tokenizer
        raise ModelLoadError(f"cannot load the tokenizer from {path}: {exc}") from None
    if key is not None:
        tokenizer_cache.store(key, tokenizer)
    return tokenizer


class TokenIdsTokenizer:
    """A checkpoint's tokenizer.json as `tokenizers` reads it, for a front that is sent token ids (an engine replica
    behind railyard's ingress, which tokenizes): it detokenizes outputs as the HF tokenizer's own backend does, and
    refuses text. It loads in milliseconds and imports neither transformers nor what transformers imports with a
    tokenizer (torch, in some versions: seconds on a GPU node, in a replica added for a burst)."""

    def __init__(self, backend) -> None:
        self.backend_tokenizer = backend  # what make_detokenizer streams through

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend_tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, **_) -> list[int]:
        raise InvalidRequestError("this engine replica takes token ids: its ingress tokenizes prompts")

    __call__ = encode


def load_token_ids_tokenizer(path: str | Path):
    """TokenIdsTokenizer for `path` where its backend is the HF tokenizer's (`_backend_is_complete`) and outputs
    stream through tokenizers' DecodeStream (make_detokenizer), as the HF tokenizer's do; else load_tokenizer(path)."""
    path = Path(path)
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream  # noqa: F401  (tokenizers >= 0.21)
    except ImportError:
        return load_tokenizer(path)
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # no such files, or ones `tokenizers` cannot read: transformers will say what is wrong
        return load_tokenizer(path)
    if isinstance(config, dict) and _backend_is_complete(backend, config):
        return TokenIdsTokenizer(backend)
    return load_tokenizer(path)


def _backend_is_complete(backend, config: dict) -> bool:
    """Whether tokenizer.json's tokenizer alone is the backend the HF tokenizer would build from the files: it holds
    every added token tokenizer_config.json lists (same id), and marks special every token the config calls special
    (so skipping special tokens skips the same ones)."""
    added = backend.get_added_tokens_decoder()
    listed = config.get("added_tokens_decoder") or {}
    for token_id, token in listed.items():
        if not str(token_id).isdigit() or int(token_id) not in added \
                or added[int(token_id)].content != _token_content(token):
            return False
    named = [config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                                     "mask_token")]
    for key in ("additional_special_tokens", "extra_special_tokens"):  # a list, or (transformers 5) a dict by name
        tokens = config.get(key) or []
        named += list(tokens.values() if isinstance(tokens, dict) else tokens)
    named += [t for t in listed.values() if isinstance(t, dict) and t.get("special")]
    specials = {_token_content(t) for t in named} - {None}
    return specials <= {t.content for t in added.values() if t.special}


def _token_content(token) -> str | None:
    """A token as tokenizer files name one: a string, or an AddedToken's dict (its content); None otherwise."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def expects_tokenizer(path: str | Path | None) -> bool:
    """Whether load_tokenizer(path) gives a tokenizer (or an error), rather than None for a directory with no
    tokenizer files, known without loading it."""
    return path is not None and not (Path(path).is_dir() and not has_tokenizer_files(path))


class LazyTokenizer:
    """The HF tokenizer at `path`, loaded once by its first user (any thread), for an engine core that needs it
    only after start-up: for grammars (structured outputs, on their compile thread) and in-process fronts.
    Loading it at start cost a served 7B engine seconds: importing transformers is seconds of Python, and beside
    the weight load and CUDA-graph capture it took the GIL from them (weights 2x slower, tokenizer 8-11 s)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._loaded = False
        self._value = None

    def get(self):
        """The tokenizer (None: the directory has none); a load error is raised to every caller until one loads."""
        with self._lock:
            if not self._loaded:
                self._value = load_tokenizer(self.path) if self.path is not None else None
                self._loaded = True
            return self._value

    def eos_token_id(self) -> int | None:
        """get().eos_token_id, read without transformers where the files say it plainly (_plain_eos_token_id);
        anything else (no tokenizer.json, no eos_token, one the vocabulary lacks, which transformers would add)
        loads the tokenizer and asks it."""
        if self.path is None:
            return None
        token_id = _plain_eos_token_id(Path(self.path))
        if token_id is not None:
            return token_id
        tokenizer = self.get()
        return tokenizer.eos_token_id if tokenizer is not None else None


def _plain_eos_token_id(path: Path) -> int | None:
    """The EOS id where the files say it plainly: tokenizer_config.json's eos_token (special_tokens_map.json
    agreeing), found in tokenizer.json by `tokenizers` (milliseconds); else None."""
    token = _eos_content(path / "tokenizer_config.json")
    mapped = _eos_content(path / "special_tokens_map.json")
    if token is None or mapped not in (None, token) or not (path / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id(token)
    except Exception:  # a tokenizer.json `tokenizers` cannot read: transformers will say what is wrong with it
        return None


def _eos_content(file: Path) -> str | None:
    """The eos_token a tokenizer file names (a string, or an AddedToken's content), None if it names none."""
    try:
        token = json.loads(file.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return _token_content(token)


def make_detokenizer(tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
    """The fastest incremental detokenizer the tokenizer allows: tokenizers' DecodeStream (Rust, one call
    per token) for fast tokenizers, else re-decoding a short window per token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        try:
            from tokenizers.decoders import DecodeStream  # noqa: F401  (tokenizers >= 0.21)
        except ImportError:
            pass
        else:
            return StreamDetokenizer(tokenizer, backend, prompt_ids, skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)


class StreamDetokenizer:
    """Incremental detokenisation by tokenizers' DecodeStream, primed with the prompt's last tokens so the
    first output token decodes as in the full text (a leading space, for example). As vLLM does, a stream
    that hits tokenizers' "invalid prefix" edge case starts over from the next token."""

    def __init__(self, tokenizer, backend, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        self._new_stream = lambda: DecodeStream(skip_special_tokens=skip_special_tokens)
        self.backend = backend
        self.stream = self._new_stream()
        for token_id in prompt_ids[-6:]:
            self._step(token_id)

    def _step(self, token_id: int) -> str | None:
        try:
            return self.stream.step(self.backend, token_id)
        except Exception as exc:  # tokenizers raises a plain Exception for this
            if "invalid prefix" not in str(exc).lower():
                raise
            self.stream = self._new_stream()
            return self.stream.step(self.backend, token_id)

    def append(self, token_id: int) -> str:
        """Add a token; returns the newly completed text (maybe empty)."""
        return self._step(token_id) or ""


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text without re-decoding everything each step.

    Multi-byte characters split over tokens are held back until complete (no U+FFFD mid-stream).
    """

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.context = prompt_ids[-6:]  # a few prompt tokens so leading spaces decode as in the full text
        self.ids: list[int] = list(self.context)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def append(self, token_id: int) -> str:
        """Add a token; returns the newly completed text (maybe empty)."""
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset],
                                       skip_special_tokens=self.skip_special)
        full = self.tokenizer.decode(self.ids[self.prefix_offset:], skip_special_tokens=self.skip_special)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""


def with_shape_tokenizer(config) -> bool:
    """A named shape (random weights) without a tokenizer gets the embedded model's byte-level one (ids < 259
    fit every vocabulary), so it speaks text; True when `config` was such a shape."""
    from railyard.shapes import is_shape

    if not is_shape(config.model) or config.tokenizer is not None:
        return False
    from railyard.engine.startup.tiny_model import ensure_tiny_model

    config.tokenizer = str(ensure_tiny_model())
    return True


def encode_prompt(tokenizer, prompt: str | list[int] | None, prompt_token_ids: list[int] | None = None, *,
                  add_special_tokens: bool = True, truncate: int | None = None) -> tuple[str | None, list[int]]:
    """(text, token ids) of a prompt given as text, token ids, or both: the one place a prompt is tokenized.

    truncate: keep only the last that many tokens (vLLM's truncate_prompt_tokens; the tokenizer truncates on the
    left, see load_tokenizer, keeping its special tokens). Raises InvalidRequestError for a prompt that is neither
    text nor ids, or text for an engine without a tokenizer."""
    if prompt_token_ids is None and isinstance(prompt, list):
        prompt, prompt_token_ids = None, prompt
    if prompt_token_ids is not None:
        return prompt, list(prompt_token_ids)
    if not isinstance(prompt, str):
        raise InvalidRequestError("prompt must be a string or a list of token ids")
    if tokenizer is None:
        raise InvalidRequestError("this engine has no tokenizer: send prompt token ids")
    if truncate is None:
        return prompt, tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    return prompt, tokenizer(prompt, add_special_tokens=add_special_tokens, truncation=True,
                             max_length=truncate)["input_ids"]
