"""`OutputProcessor`: the front's half of the engine (vLLM v1's OutputProcessor).

It turns the engine core's per-step token deltas into `RequestOutput`s: incremental detokenisation,
stop strings (the one stop rule that needs text: on a match it finishes the sequence here and asks the
core to stop it), logprob bookkeeping and latency metrics on the front's clock. It runs wherever the
request's consumer is (the API's event loop, the Ray replica, the offline LLM), never in the step loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from railyard.engine.config import SamplingParams
from railyard.engine.outputs import (
    CompletionOutput,
    RequestMetrics,
    RequestOutput,
    SeqDelta,
)
from railyard.engine.tokenizer import make_detokenizer


@dataclass
class _SeqState:
    index: int
    detok: object | None  # an incremental detokenizer, or None without a tokenizer
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_text: int = 0  # delta outputs: how much of text / token_ids went out already
    sent_tokens: int = 0
    finish_sent: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[_SeqState]
    metrics: RequestMetrics
    stop_holdback: int  # chars held back while a stop string may still be forming
    num_finished: int = 0
    prompt_sent: bool = False

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.seqs)


@dataclass
class ProcessedOutputs:
    """One batch of core deltas, processed."""

    outputs: list[RequestOutput]  # for the requests' consumers, as each request's output kind asks
    stop: list[tuple[str, int, str]]  # (request id, sequence index, stop string): finished here, not in the core
    # Every request that advanced, final_only ones included (with no outputs until they finish): for metrics.
    progress: list[RequestOutput]


class OutputProcessor:
    """Per-request text and bookkeeping state between the engine core and the request's consumer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> None:
        detok = self.tokenizer is not None
        seqs = [_SeqState(i, make_detokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
                          if detok else None, logprobs=[] if params.logprobs is not None else None)
                for i in range(params.n)]
        holdback = max((len(s) for s in params.stop), default=1) - 1
        self.requests[request_id] = _RequestState(
            request_id, prompt, prompt_token_ids, params, seqs,
            RequestMetrics(arrival_time, num_prompt_tokens=len(prompt_token_ids)), holdback)

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has(self, request_id: str) -> bool:
        return request_id in self.requests

    def __len__(self) -> int:
        return len(self.requests)

    def process_step(self, deltas: Iterable[SeqDelta], now: float,
                     stop_sequence: Callable[[str, int, str], None]) -> ProcessedOutputs:
        """A core's step on the front, as every driver of a core (Engine, the clients) handles it: process the
        deltas, then stop in the core each sequence a stop string finished here (stop_sequence(request id,
        sequence index, stop string)), so that it frees its blocks before its next step."""
        processed = self.process(deltas, now)
        for request_id, index, stop in processed.stop:
            stop_sequence(request_id, index, stop)
        return processed

    def process(self, deltas: Iterable[SeqDelta], now: float) -> ProcessedOutputs:
        """Apply a step's deltas; finished requests are forgotten after this."""
        touched: dict[str, _RequestState] = {}
        stop: list[tuple[str, int, str]] = []
        for d in deltas:
            req = self.requests.get(d.request_id)
            if req is None:  # aborted here, or finished by a stop string while the core still ran it
                continue
            seq = req.seqs[d.index]
            if seq.finished:
                continue
            if d.first_scheduled_time is not None and req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = d.first_scheduled_time
            if d.index == 0 and d.num_cached_prompt_tokens:
                req.metrics.num_cached_prompt_tokens = d.num_cached_prompt_tokens
            matched = self._append(req, seq, d)
            if matched is not None:
                stop.append((req.request_id, seq.index, matched))
            if seq.finished:
                req.num_finished += 1
            touched[req.request_id] = req
        outputs, progress = [], []
        for req in touched.values():
            m = req.metrics
            if m.first_token_time is None:
                m.first_token_time = now
            elif m.last_token_time is not None:
                m.longest_token_gap = max(m.longest_token_gap, now - m.last_token_time)
            m.last_token_time = now
            finished = req.finished
            if finished:
                m.finished_time = now
                del self.requests[req.request_id]
            kind = req.params.output_kind
            if kind == "delta":
                outputs.append(self._delta_output(req, finished))
            elif finished or kind == "cumulative":
                outputs.append(self._full_output(req, finished))
            else:
                progress.append(RequestOutput(req.request_id, req.prompt, None, [], False, m))
        progress.extend(outputs)
        return ProcessedOutputs(outputs, stop, progress)

    def _append(self, req: _RequestState, seq: _SeqState, d: SeqDelta) -> str | None:
        """Add a delta's tokens to a sequence; returns the stop string that finished it here, if any."""
        p = req.params
        last = len(d.token_ids) - 1
        for i, token in enumerate(d.token_ids):
            seq.token_ids.append(token)
            req.metrics.num_output_tokens += 1
            if d.logprobs is not None and seq.logprobs is not None:
                seq.logprobs.append(d.logprobs[i])
                seq.cumulative_logprob += d.logprobs[i][token]
            # A token that stops the sequence as EOS / a stop token id adds no text, as in vLLM.
            if seq.detok is not None and not (i == last and d.finish_reason == "stop"):
                new_text = seq.detok.append(token)
                if new_text:
                    seq.text += new_text
                    if p.stop and len(seq.token_ids) >= p.min_tokens:
                        matched = self._check_stop_strings(req, seq, len(new_text))
                        if matched is not None:
                            seq.finish_reason, seq.stop_reason = "stop", matched
                            # The core already finished it if this token also ended it there.
                            return matched if not (i == last and d.finish_reason) else None
        if d.finish_reason is not None:
            seq.finish_reason, seq.stop_reason = d.finish_reason, d.stop_reason
        return None

    @staticmethod
    def _check_stop_strings(req: _RequestState, seq: _SeqState, delta_len: int) -> str | None:
        text = seq.text
        for stop in req.params.stop:
            # Only the new text (plus a stop's length of overlap) can hold a new match.
            pos = text.find(stop, max(0, len(text) - delta_len - len(stop) + 1))
            if pos >= 0:
                end = pos + len(stop) if req.params.include_stop_str_in_output else pos
                seq.text = text[:end]
                return stop
        return None

    def _visible_text(self, req: _RequestState, seq: _SeqState) -> str:
        if not seq.finished and req.stop_holdback:
            return seq.text[: max(0, len(seq.text) - req.stop_holdback)]  # a stop string may still be forming
        return seq.text

    def _delta_output(self, req: _RequestState, finished: bool) -> RequestOutput:
        outs = []
        for seq in req.seqs:
            text = self._visible_text(req, seq)
            new_ids = seq.token_ids[seq.sent_tokens:]
            new_text = text[seq.sent_text:] if len(text) > seq.sent_text else ""
            finish_now = seq.finished and not seq.finish_sent
            if not new_ids and not new_text and not finish_now:
                continue
            outs.append(CompletionOutput(
                index=seq.index, text=new_text, token_ids=new_ids,
                cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
                logprobs=seq.logprobs[seq.sent_tokens:] if seq.logprobs is not None else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            seq.sent_tokens, seq.sent_text = len(seq.token_ids), max(seq.sent_text, len(text))
            seq.finish_sent = seq.finished
        prompt_ids = None if req.prompt_sent else req.prompt_token_ids
        req.prompt_sent = True
        return RequestOutput(req.request_id, req.prompt, prompt_ids, outs, finished, req.metrics)

    def _full_output(self, req: _RequestState, finished: bool) -> RequestOutput:
        outs = [CompletionOutput(
            index=seq.index, text=self._visible_text(req, seq), token_ids=list(seq.token_ids),
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason) for seq in req.seqs]
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished, req.metrics)
