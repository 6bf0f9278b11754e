"""POST /v1/completions: one or several prompts (text or token ids), n choices each, optionally streamed."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from railyard.api.errors import error_body
from railyard.api.generation import ChoiceState, Generation, Prompt, chunk_usage, merge_streams, now_s, usage
from railyard.api.protocol import CompletionRequest
from railyard.api.sse import EventStreamResponse, sse
from railyard.api.structured import structured_outputs
from railyard.engine.outputs import RequestOutput
from railyard.errors import InvalidRequestError


async def _prompts(gen: Generation, req: CompletionRequest) -> list[Prompt]:
    p, keep = req.prompt, req.truncate_prompt_tokens

    async def text(x: str) -> Prompt:
        return Prompt(x, await gen.tokenize(x, req.add_special_tokens, keep))

    def ids(x: list[int]) -> Prompt:  # token ids: the engine client checks them against the vocabulary
        return Prompt(None, list(x[-keep:] if keep else x))

    if isinstance(p, str):
        return [await text(p)]
    if not p:
        raise InvalidRequestError("The prompt is empty.")
    if all(isinstance(x, str) for x in p):
        return [await text(x) for x in p]
    if all(isinstance(x, int) for x in p):
        return [ids(p)]
    return [ids(x) for x in p]


def _logprobs(gen: Generation, token_ids: list[int], logprobs: list[dict[int, float]], k: int, offset: int,
              as_ids: bool | None = False) -> dict:
    tokens = [gen.token_label(t, as_ids) for t in token_ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp[t] for t, lp in zip(token_ids, logprobs)],
        "top_logprobs": [{gen.token_label(t, as_ids): v for t, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]}
                         for lp in logprobs],
        "text_offset": offsets,
    }


async def create_completion(gen: Generation, req: CompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()
    prompts = await _prompts(gen, req)
    for p in prompts:
        gen.check_length(p, req.max_tokens)
    params = gen.sampling_params(req, req.max_tokens, req.logprobs, structured_outputs(req))  # [structured outputs]
    request_id = f"cmpl-{req.request_id or uuid.uuid4().hex}"
    streams = await gen.submit(request_id, prompts, params, req.priority, arrival)
    created = now_s()
    if req.stream:
        return EventStreamResponse(_stream(gen, req, request_id, created, streams), streams)
    outputs = await gen.collect(streams, raw)
    if outputs is None:
        return Response(status_code=499)  # the client left; nobody reads this
    choices = []
    for i, out in enumerate(outputs):
        for c in out.outputs:
            choices.append({
                "index": i * req.n + c.index, "text": c.text,
                "logprobs": _logprobs(gen, c.token_ids, c.logprobs, req.logprobs, 0, req.return_tokens_as_token_ids)
                if req.logprobs is not None
                else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    return JSONResponse({"id": request_id, "object": "text_completion", "created": created, "model": gen.model_name,
                         "choices": choices, "usage": usage(outputs)})


async def _stream(gen: Generation, req: CompletionRequest, request_id: str, created: int, streams):
    choices: dict[int, ChoiceState] = {}
    latest: dict[int, RequestOutput] = {}
    include_usage = req.stream_options is not None and req.stream_options.usage_at_end
    every_chunk = req.stream_options is not None and req.stream_options.usage_in_every_chunk
    head = {"id": request_id, "object": "text_completion", "created": created, "model": gen.model_name}
    try:
        async for i, out in merge_streams(streams):
            latest[i] = out
            for c in out.outputs:  # delta outputs: one chunk per choice that advanced, as OpenAI streams them
                index = i * req.n + c.index
                state = choices.setdefault(index, ChoiceState())
                logprobs = None
                if req.logprobs is not None:
                    logprobs = _logprobs(gen, c.token_ids, c.logprobs, req.logprobs, state.text_len,
                                         req.return_tokens_as_token_ids)
                state.text_len += len(c.text)
                choice = {"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason}
                state.tokens += len(c.token_ids)
                chunk_usage_field = {}
                if every_chunk:
                    chunk_usage_field = {"usage": chunk_usage(out.metrics.num_prompt_tokens, state.tokens)}
                elif include_usage:
                    chunk_usage_field = {"usage": None}
                yield sse({**head, "choices": [choice], **chunk_usage_field})
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(list(latest.values()))})
    except Exception as exc:  # the engine died mid-stream: say so in-band, then end the stream
        yield sse(error_body(400 if isinstance(exc, InvalidRequestError) else 503, str(exc)))
    yield sse("[DONE]")
