"""The engine's side of structured outputs: which sequences are constrained, their matchers, the step's bitmask.

Every call comes from the engine's step loop, which alone knows the batch:
- `add` starts a request's compile; `take_ready` hands its sequences to the scheduler once compiled;
- `needs_bitmask` says whether a step samples a constrained row (then its sampling waits for the mask);
- `bitmask` fills the step's token bitmask for its constrained rows (rows in the step's sampling order);
  `bitmask_async` does the same on the manager's fill thread (xgrammar's fill runs without the GIL, so the
  step loop sends outputs and schedules the next step meanwhile); no matcher is touched until it is done;
- `accept` advances a sequence's matcher by each token the host learns, in order.
Matchers only ever see tokens the engine keeps: a token sampled for a sequence that its previous token
finished is discarded unseen, and recompute preemption keeps the output tokens (so the matcher's state
stays right without a rollback).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from railyard.engine.sched.scheduler import SchedulerOutput
from railyard.engine.sched.sequence import Sequence
from railyard.engine.structured.compiler import GrammarCompiler
from railyard.engine.structured.grammar import check, clean_message
from railyard.engine.structured.params import StructuredOutputsParams
from railyard.errors import InvalidRequestError

log = logging.getLogger("railyard.engine")


class Accepted(Enum):
    NOT_CONSTRAINED = 0
    OK = 1
    TERMINATED = 2  # the grammar is complete (its stop token was accepted): nothing more may follow
    REJECTED = 3  # the token is outside the grammar (possible only if its row was not masked)


@dataclass
class GrammarBitmask:
    """A step's token bitmask on the host: int32 [rows, ceil(vocab_size / 32)]; only `rows` are filled and applied.
    Logits of ids at or past vocab_size (the model's beyond its tokenizer's) are forbidden in those rows."""

    tensor: torch.Tensor
    rows: list[int]
    vocab_size: int


@dataclass
class _Compiling:
    seqs: list[Sequence]
    future: Future


class StructuredOutputManager:
    """Grammars and matchers for one engine's constrained sequences (idle until the first one)."""

    def __init__(self, load_tokenizer: Callable[[], Any] | None, vocab_size: int, stop_token_ids: tuple[int, ...],
                 disable_any_whitespace: bool = False, warm_up_mask: Callable[[int], None] | None = None) -> None:
        """load_tokenizer: the engine's tokenizer, called once on the compile thread (None: the engine has none);
        warm_up_mask: GrammarCompiler's."""
        self.disable_any_whitespace = disable_any_whitespace  # the default of requests that leave it unset
        # The tokenizer's load, xgrammar's import and the token table run on the compile thread when the first
        # constrained request arrives (GrammarCompiler), not on the step loop and not at start-up.
        self._compiler = GrammarCompiler(load_tokenizer, vocab_size, stop_token_ids, warm_up_mask=warm_up_mask) \
            if load_tokenizer is not None else None
        self._compiling: dict[str, _Compiling] = {}  # by request id
        self._matchers: dict[int, object] = {}  # by seq id: xgrammar GrammarMatcher
        self._buffers: list[torch.Tensor] = []  # two host bitmasks, used in turn
        self._turn = 0
        self._batch = None  # xgrammar BatchGrammarMatcher (fills many rows on its own threads)
        self._fill_thread: ThreadPoolExecutor | None = None  # bitmask_async's (started by its first call)

    # -- requests --------------------------------------------------------------------------------
    def validate(self, spec: StructuredOutputsParams) -> None:
        """Refuse a constraint this engine cannot apply (InvalidRequestError), before it is queued."""
        if self._compiler is None:
            raise InvalidRequestError("structured outputs need a tokenizer, and this engine has none (a named shape "
                                      "without --tokenizer)")
        check(spec)

    def add(self, request_id: str, seqs: list[Sequence], spec: StructuredOutputsParams) -> None:
        """Start compiling the request's grammar; its sequences wait here until `take_ready` returns them."""
        if spec.disable_any_whitespace is None:
            spec = dataclasses.replace(spec, disable_any_whitespace=self.disable_any_whitespace)
        self._compiling[request_id] = _Compiling(seqs, self._compiler.compile(spec))

    def prepare(self) -> bool:
        """Set grammars up now and wait (the tokenizer, xgrammar, the mask kernel's warm-up), as the first constrained
        request would: for `railyard cache fill`, which leaves the mask kernel in the kernel cache. False where the
        engine has no tokenizer (no constraint can come)."""
        if self._compiler is None:
            return False
        return self.vocab_size > 0

    @property
    def vocab_size(self) -> int:
        """The ids a bitmask covers (the tokenizer's, at most the model's): known once the tokenizer has loaded,
        which every compiled grammar waited for."""
        return self._compiler.vocab_size

    @property
    def num_compiling(self) -> int:
        """Requests waiting for their grammar."""
        return len(self._compiling)

    @property
    def num_compiling_seqs(self) -> int:
        return sum(len(c.seqs) for c in self._compiling.values()) if self._compiling else 0

    def take_ready(self, wait_s: float = 0.0) -> tuple[list[Sequence], dict[str, str]]:
        """Sequences whose grammar is compiled (each now has its matcher), and {request id: error} for
        requests whose compile failed. Waits up to wait_s for a first compile to finish if none has."""
        if wait_s > 0 and not any(c.future.done() for c in self._compiling.values()):
            wait([c.future for c in self._compiling.values()], timeout=wait_s, return_when=FIRST_COMPLETED)
        import xgrammar as xgr

        ready, failed = [], {}
        for request_id, c in list(self._compiling.items()):
            if not c.future.done():
                continue
            del self._compiling[request_id]
            error = c.future.exception()
            if error is not None:
                failed[request_id] = f"the constraint could not be compiled: {clean_message(error)}"
                continue
            for seq in c.seqs:
                self._matchers[seq.seq_id] = xgr.GrammarMatcher(c.future.result())
            ready.extend(c.seqs)
        return ready, failed

    def forget(self, request_id: str, seq_ids: list[int]) -> None:
        """Drop a finished or aborted request's state (compile wait or matchers)."""
        self._compiling.pop(request_id, None)
        for seq_id in seq_ids:
            self._matchers.pop(seq_id, None)

    # -- steps -----------------------------------------------------------------------------------
    def needs_bitmask(self, out: SchedulerOutput) -> bool:
        """Whether the step samples for a constrained sequence."""
        if not self._matchers:
            return False
        return any(item.sample and item.seq.seq_id in self._matchers for item in out.scheduled)

    def bitmask(self, sampled: list[Sequence]) -> GrammarBitmask | None:
        """The token bitmask for the step's sampled rows (in order): filled for each live constrained row.

        Every token before the row's own must be known (and accepted) by now."""
        todo = self._rows_to_fill(sampled)
        return self._fill(*todo) if todo is not None else None

    def bitmask_async(self, sampled: list[Sequence]) -> Future:
        """`bitmask` on the fill thread: a future of the same GrammarBitmask (or None). The rows are chosen now;
        the caller must not advance a matcher (`accept`) before the future is done."""
        todo = self._rows_to_fill(sampled)
        if todo is None:
            done: Future = Future()
            done.set_result(None)
            return done
        if self._fill_thread is None:
            self._fill_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="railyard-bitmask")
        return self._fill_thread.submit(self._fill, *todo)

    def _rows_to_fill(self, sampled: list[Sequence]) -> tuple[list, list[int], int] | None:
        """(matchers, rows, number of rows) of the step's live constrained rows, or None if there are none."""
        rows, matchers = [], []
        for i, seq in enumerate(sampled):
            matcher = self._matchers.get(seq.seq_id)
            if matcher is not None and not seq.is_finished:
                rows.append(i)
                matchers.append(matcher)
        return (matchers, rows, len(sampled)) if rows else None

    def _fill(self, matchers: list, rows: list[int], num_rows: int) -> GrammarBitmask:
        tensor = self._buffer(num_rows)
        if self._batch is None:
            import xgrammar as xgr

            self._batch = xgr.BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask(matchers, tensor, rows)
        return GrammarBitmask(tensor, rows, self.vocab_size)

    def accept(self, seq: Sequence, token: int) -> Accepted:
        """Advance the sequence's matcher by its next known token."""
        matcher = self._matchers.get(seq.seq_id)
        if matcher is None:
            return Accepted.NOT_CONSTRAINED
        if not matcher.accept_token(token):
            log.warning("request %s: token %d is outside its grammar; ending it", seq.request_id, token)
            return Accepted.REJECTED
        return Accepted.TERMINATED if matcher.is_terminated() else Accepted.OK

    def _buffer(self, num_rows: int) -> torch.Tensor:
        # Two buffers in turn: a step's mask may still be on its way to the device while the next is filled.
        width = (self.vocab_size + 31) // 32
        if not self._buffers or self._buffers[0].shape[0] < num_rows:
            pin = torch.cuda.is_available()
            rows = max(num_rows, 64)
            self._buffers = [torch.empty((rows, width), dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._turn ^= 1
        return self._buffers[self._turn][:num_rows]

    def shutdown(self) -> None:
        if self._fill_thread is not None:
            self._fill_thread.shutdown(wait=False, cancel_futures=True)
        if self._compiler is not None:
            self._compiler.shutdown()
