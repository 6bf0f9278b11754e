"""Compiling constraints into token-level grammars, on a thread of their own, cached by constraint.

A first-seen JSON schema can take tens to hundreds of milliseconds to compile against a large vocabulary
(xgrammar precomputes which tokens each grammar position accepts). Compiles run on one background thread
(xgrammar parallelises each compile internally and releases the GIL), so the step loop keeps serving other
requests meanwhile; like vLLM's StructuredOutputManager, a request waits outside the batch until its
grammar is ready. Equal constraints share one compile (and one cache entry) by StructuredOutputsParams.key.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from railyard.engine.structured.grammar import grammar_source
from railyard.engine.structured.params import StructuredOutputsParams

log = logging.getLogger("railyard.engine")

DEFAULT_CACHE_ENTRIES = 1024


class GrammarCompiler:
    """xgrammar's GrammarCompiler over the engine's tokenizer, behind a cache of futures."""

    def __init__(self, load_tokenizer: Callable[[], Any], model_vocab_size: int, stop_token_ids: tuple[int, ...],
                 max_entries: int = DEFAULT_CACHE_ENTRIES,
                 warm_up_mask: Callable[[int], None] | None = None) -> None:
        """warm_up_mask(vocab_size): run on the compile thread once the masks' width is known, before the first
        grammar is compiled (logits_mask.warm_up_bitmask: no constrained row then meets a kernel on its first use)."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="railyard-grammar")
        # The tokenizer is loaded (importing transformers), xgrammar imported and the token table read once, on the
        # compile thread, when the first constraint arrives (as vLLM sets up its grammar backend): seconds of Python
        # that would otherwise take the GIL from the engine's start-up or its first steps, which most engines
        # never need; the step loop never waits for it.
        self._setup = (load_tokenizer, model_vocab_size, stop_token_ids, warm_up_mask)
        self._compiler: Future | None = None
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self.max_entries = max_entries
        self.num_compiled = 0

    def compile(self, spec: StructuredOutputsParams) -> Future:
        """A future of the compiled grammar (already done if this constraint was compiled before)."""
        key = spec.key()
        future = self._cache.get(key)
        if future is None:
            self._set_up()
            future = self._cache[key] = self._pool.submit(self._compile, spec)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return future

    def _set_up(self) -> Future:
        """The future of (xgrammar's compiler, the ids it covers), its making queued on the compile thread once."""
        if self._compiler is None:
            self._compiler = self._pool.submit(_make_compiler, *self._setup)
        return self._compiler

    @property
    def vocab_size(self) -> int:
        """The ids the grammars cover (grammar_vocab_size); waits for the tokenizer's load."""
        return self._set_up().result()[1]

    def _compile(self, spec: StructuredOutputsParams):
        compiler = self._set_up().result()[0]
        source = grammar_source(spec)
        start = time.perf_counter()
        if source.kind == "json":
            compiled = compiler.compile_json_schema(source.text, any_whitespace=source.any_whitespace)
        elif source.kind == "regex":
            compiled = compiler.compile_regex(source.text)
        else:
            compiled = compiler.compile_grammar(source.text)
        self.num_compiled += 1
        log.debug("compiled a %s constraint in %.1f ms", spec.kind, (time.perf_counter() - start) * 1e3)
        return compiled

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def grammar_vocab_size(tokenizer, model_vocab_size: int) -> int:
    """The ids the grammar masks cover: the tokenizer's, or the model's where it has fewer. Ids the model has
    beyond its tokenizer (padding, or a named shape's 152k vocabulary over the 259-token byte tokenizer) are
    masked apart (apply_bitmask): as xgrammar ids they would cost it a scan of them on every accepted token."""
    return min(len(tokenizer), model_vocab_size)


def _make_compiler(load_tokenizer: Callable[[], Any], model_vocab_size: int, stop_token_ids: tuple[int, ...],
                   warm_up_mask: Callable[[int], None] | None = None):
    """(xgrammar's compiler, the ids it covers)."""
    import xgrammar as xgr

    tokenizer = load_tokenizer()
    vocab_size = grammar_vocab_size(tokenizer, model_vocab_size)
    # The stop tokens are the engine's EOS ids (those the tokenizer has): they end a finished grammar.
    stops = [t for t in stop_token_ids if t < vocab_size] or None
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stops)
    threads = max(1, min(8, (os.cpu_count() or 2) // 2))
    if warm_up_mask is not None:
        warm_up_mask(vocab_size)
    # Our own cache (by constraint) holds the compiled grammars; xgrammar's second one would only double them.
    return xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False), vocab_size
