"""What both endpoints share: checks at the door, tokenisation off the event loop, SamplingParams,
submitting prompts to the engine client, and waiting for results (aborting if the client leaves).

The API speaks to its engine only through the EngineClient interface (railyard.engine.client.base): the
same code serves a local engine process, an in-process engine and a fleet of Ray Serve replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache

from fastapi import Request

from railyard.api.output_parsers import resolve_parsers
from railyard.api.protocol import SamplingRequest
from railyard.engine.client.base import EngineClient
from railyard.engine.config import SamplingParams
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import OutputKind, RequestOutput
from railyard.engine.structured import StructuredOutputsParams
from railyard.engine.tokenizer import encode_prompt
from railyard.errors import InvalidRequestError

# Tokenising a text this long on the event loop would hold every other stream up: it goes to a thread.
_TOKENIZE_INLINE_CHARS = 4096


@dataclass
class Prompt:
    """A prompt as the engine gets it: its text (if any) and its token ids."""

    text: str | None
    token_ids: list[int]


class Generation:
    """The server's view of one model: its name, its tokenizer, its engine client and the engine's limits; or of
    one of its LoRA adapters (for_adapter), which shares the rest."""

    def __init__(self, client: EngineClient, served_model_name: str, tokenizer=None) -> None:
        self.client = client
        self.model_name = served_model_name
        self.lora: LoRARequest | None = None
        self.tokenizer = tokenizer if tokenizer is not None else client.tokenizer  # the front's own copy
        self.max_model_len = client.model_info.max_model_len
        self.token_text = lru_cache(maxsize=65536)(self._decode_one)
        self._max_prompt_chars: int | None = None
        info = client.model_info
        self.parsers = resolve_parsers(info.reasoning_parser, info.tool_call_parser,
                                       getattr(self.tokenizer, "chat_template", None))

    def for_adapter(self, lora: LoRARequest) -> Generation:
        """This model's view under a LoRA adapter: responses name the adapter, requests run with it."""
        if self.tokenizer is not None:
            _ = self.max_prompt_chars  # computed once here, shared by every view
        view = copy.copy(self)
        view.model_name, view.lora = lora.lora_name, lora
        return view

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # -- at the door -----------------------------------------------------------------------------
    async def tokenize(self, text: str, add_special_tokens: bool = True, truncate: int | None = None) -> list[int]:
        """Token ids of a text; a text that cannot fit in max_model_len tokens is refused before it is tokenised.

        truncate: keep only the last that many tokens (vLLM's truncate_prompt_tokens); then any length is taken.
        """
        if self.tokenizer is None:
            raise InvalidRequestError("this model has no tokenizer (its checkpoint has no tokenizer files): send the "
                                      "prompt as token ids to /v1/completions")
        if truncate is None and len(text) > self.max_prompt_chars:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                f"{len(text)} characters, more than {self.max_model_len} tokens of this tokenizer can hold. "
                "Please reduce the length of the prompt.")
        encode = functools.partial(encode_prompt, self.tokenizer, text, add_special_tokens=add_special_tokens,
                                   truncate=truncate)
        _, ids = encode() if len(text) <= _TOKENIZE_INLINE_CHARS else await asyncio.to_thread(encode)
        return ids

    def token_label(self, token_id: int, as_id: bool | None = False) -> str:
        """A token as logprobs show it: its text, or vLLM's 'token_id:N' (asked for, or without a tokenizer)."""
        return f"token_id:{token_id}" if as_id or self.tokenizer is None else self.token_text(token_id)

    @property
    def max_prompt_chars(self) -> int:
        """No token is longer than the tokenizer's longest token: max_model_len of those bound any prompt's length
        (a character is at least one byte, so comparing characters is conservative)."""
        if self._max_prompt_chars is None:
            vocab = self.tokenizer.get_vocab()
            longest = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1)
            self._max_prompt_chars = self.max_model_len * max(longest, 1)
        return self._max_prompt_chars

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

    def sampling_params(self, req: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                        structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
        """SamplingParams from the request (OpenAI defaults where unset); bad values raise InvalidRequestError.

        Streamed requests get delta outputs (only what is new, merged while a client reads slowly), the others
        one final output.
        """
        if req.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer, and this model has none: use stop_token_ids")
        kind: OutputKind = "delta" if req.stream else "final_only"
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
            seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens,
            stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, logprobs=logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens, output_kind=kind, structured_outputs=structured_outputs)

    # -- into the engine and back ----------------------------------------------------------------
    async def submit(self, request_id: str, prompts: list[Prompt], params: SamplingParams, priority: int,
                     arrival_time: float) -> list:
        """Queue every prompt (all or none: a refused one aborts those already queued); their streams."""
        streams = []
        try:
            for i, p in enumerate(prompts):
                streams.append(await self.client.add_request(
                    f"{request_id}-{i}", p.text, params, prompt_token_ids=p.token_ids, arrival_time=arrival_time,
                    priority=priority, lora=self.lora))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    async def collect(self, streams: list, request: Request) -> list[RequestOutput] | None:
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


async def merge_streams(streams: list) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several streams as they come; closing it aborts every unfinished one."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
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


@dataclass
class ChoiceState:
    """A streamed choice: whether its first chunk went out, and its text so far (logprob offsets)."""

    started: bool = False
    text_len: int = 0
    tokens: int = 0


def now_s() -> int:
    return int(time.time())


def chunk_usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """vLLM's continuous_usage_stats: the usage so far, in a chunk of one choice."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage(outputs: list[RequestOutput]) -> dict:
    """OpenAI usage: each prompt counted once, every choice's tokens counted."""
    prompt = sum(o.metrics.num_prompt_tokens for o in outputs)
    completion = sum(o.metrics.num_output_tokens for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
