"""What both endpoints share: checks at the door, SamplingParams, submitting prompts to the
AsyncEngine, waiting for results (aborting if the client leaves), and per-choice stream deltas."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import lru_cache

from fastapi import Request

from railyard.api.protocol import SamplingRequest
from railyard.engine.async_engine import AsyncEngine, RequestStream
from railyard.engine.config import SamplingParams
from railyard.engine.outputs import RequestOutput
from railyard.errors import InvalidRequestError


@dataclass
class Prompt:
    """A prompt as the engine gets it: its text (if any) and its token ids."""

    text: str | None
    token_ids: list[int]


@dataclass
class Delta:
    """What one choice gained since the last chunk sent for it."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: int | str | None
    first: bool


@dataclass
class _Sent:
    text: int = 0
    tokens: int = 0
    finished: bool = False
    started: bool = False


@dataclass
class DeltaTracker:
    """Turns cumulative RequestOutputs into per-choice deltas (choice index = prompt index * n + i)."""

    n: int
    sent: dict[int, _Sent] = field(default_factory=dict)

    def deltas(self, prompt_index: int, out: RequestOutput) -> list[Delta]:
        result = []
        for c in out.outputs:
            index = prompt_index * self.n + c.index
            s = self.sent.setdefault(index, _Sent())
            text = c.text[s.text:] if len(c.text) > s.text else ""
            finish = c.finish_reason if not s.finished else None
            new_ids = c.token_ids[s.tokens:]
            if not new_ids and not text and finish is None:
                continue
            # New tokens go out even while their text is held back (partial UTF-8, a stop string forming):
            # as in vLLM, a chunk per step keeps token timing visible to clients and benchmarks.
            new_lps = c.logprobs[s.tokens:] if c.logprobs is not None else None
            result.append(Delta(index, text, new_ids, new_lps, finish, c.stop_reason if finish else None,
                                not s.started))
            s.text, s.tokens, s.started = len(c.text), len(c.token_ids), True
            s.finished = s.finished or finish is not None
        return result


class Generation:
    """The server's one model: its name, tokenizer and engine, and how requests reach it."""

    def __init__(self, engine: AsyncEngine, served_model_name: str, tokenizer, max_model_len: int | None = None) -> None:
        self.engine = engine  # an AsyncEngine, or anything with its add_request -> stream interface
        self.model_name = served_model_name
        self.tokenizer = tokenizer  # the front's own copy: the engine thread detokenises with its own
        self.max_model_len = max_model_len or engine.engine.config.max_model_len
        self.token_text = lru_cache(maxsize=65536)(self._decode_one)

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # -- at the door -----------------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True, truncate: int | None = None) -> list[int]:
        """Token ids of a text prompt; truncate: keep only the last that many (vLLM's truncate_prompt_tokens)."""
        if self.tokenizer is None:
            raise InvalidRequestError("this model has no tokenizer (its checkpoint has no tokenizer files): send the "
                                      "prompt as token ids to /v1/completions")
        if truncate is None:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        # As vLLM: the tokenizer truncates (on the left, see load_tokenizer), keeping its special tokens.
        return self.tokenizer(text, add_special_tokens=add_special_tokens, truncation=True,
                              max_length=truncate)["input_ids"]

    def token_label(self, token_id: int, as_id: bool | None = False) -> str:
        """A token as logprobs show it: its text, or vLLM's 'token_id:N' (asked for, or without a tokenizer)."""
        return f"token_id:{token_id}" if as_id or self.tokenizer is None else self.token_text(token_id)

    def check_length(self, prompt: Prompt, max_tokens: int | None) -> None:
        n, limit = len(prompt.token_ids), self.max_model_len
        if n == 0:
            raise InvalidRequestError("The prompt is empty.")
        if n >= limit or (max_tokens is not None and n + max_tokens > limit):
            asked = f" and {max_tokens} in the completion" if max_tokens is not None else ""
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + (max_tokens or 0)} tokens ({n} in the prompt{asked}). Please reduce the length of the prompt "
                "or the completion.")

    def sampling_params(self, req: SamplingRequest, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """SamplingParams from the request (OpenAI defaults where unset); bad values raise InvalidRequestError."""
        if req.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer, and this model has none: use stop_token_ids")
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens,
            stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, logprobs=logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens)

    # -- into the engine and back ----------------------------------------------------------------
    async def submit(self, request_id: str, prompts: list[Prompt], params: SamplingParams, priority: int,
                     arrival_time: float) -> list[RequestStream]:
        """Queue every prompt (all or none: a refused one aborts those already queued)."""
        streams: list[RequestStream] = []
        try:
            for i, p in enumerate(prompts):
                streams.append(await self.engine.add_request(
                    f"{request_id}-{i}", p.text, params, prompt_token_ids=p.token_ids, arrival_time=arrival_time,
                    priority=priority))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    async def collect(self, streams: list[RequestStream], request: Request) -> list[RequestOutput] | None:
        """Every request's final output, or None if the client disconnected first (all are then aborted)."""

        async def finals() -> list[RequestOutput]:
            results = []
            for stream in streams:
                last = None
                async for last in stream:
                    pass
                results.append(last)
            return results

        work = asyncio.ensure_future(finals())
        watcher = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            return work.result() if work.done() else None
        finally:
            for task in (work, watcher):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            for stream in streams:
                stream.abort()  # no-op for finished ones


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several streams as they come; closing it aborts every unfinished one."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out, None))
        except Exception as exc:
            queue.put_nowait((i, None, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, out, exc = await queue.get()
            if exc is not None:
                raise exc
            remaining -= out.finished
            yield i, out
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.abort()


def now_s() -> int:
    return int(time.time())


def usage(outputs: list[RequestOutput]) -> dict:
    """OpenAI usage: each prompt counted once, every choice's tokens counted."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
