"""POST /v1/chat/completions: messages through the checkpoint's own chat template, n choices, optional SSE."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from railyard.api.errors import error_body
from railyard.api.generation import ChoiceState, Generation, Prompt, now_s, usage
from railyard.api.protocol import ChatCompletionRequest
from railyard.api.sse import EventStreamResponse, sse
from railyard.errors import InvalidRequestError


async def render_chat(gen: Generation, req: ChatCompletionRequest) -> Prompt:
    """The prompt text and ids, exactly as transformers' apply_chat_template renders the messages."""
    if getattr(gen.tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions")
    messages = [m.template_dict() for m in req.messages]
    try:
        text = gen.tokenizer.apply_chat_template(messages, tokenize=False, **req.template_kwargs())
    except Exception as exc:  # the template itself rejects the conversation (jinja raise_exception etc.)
        raise InvalidRequestError(f"the chat template cannot render these messages: {exc}") from None
    # The template already carries the special tokens it wants; add_special_tokens (vLLM's, default off) adds more.
    return Prompt(text, await gen.tokenize(text, req.add_special_tokens, req.truncate_prompt_tokens))


def _logprobs(gen: Generation, token_ids: list[int], logprobs: list[dict[int, float]], k: int,
              as_ids: bool | None = False) -> list[dict]:
    def entry(t: int, v: float) -> dict:
        text = gen.token_label(t, as_ids)
        return {"token": text, "logprob": v, "bytes": list(text.encode("utf-8"))}

    return [{**entry(t, lp[t]),
             "top_logprobs": [entry(a, v) for a, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]]}
            for t, lp in zip(token_ids, logprobs)]


async def create_chat_completion(gen: Generation, req: ChatCompletionRequest, raw: Request) -> Response:
    arrival = time.monotonic()
    prompt = await render_chat(gen, req)
    max_tokens = req.max_completion_tokens or req.max_tokens
    gen.check_length(prompt, max_tokens)
    k = (req.top_logprobs or 0) if req.logprobs else None
    params = gen.sampling_params(req, max_tokens, k)
    request_id = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
    streams = await gen.submit(request_id, [prompt], params, req.priority, arrival)
    created = now_s()
    if req.stream:
        return EventStreamResponse(_stream(gen, req, request_id, created, streams[0]), streams)
    outputs = await gen.collect(streams, raw)
    if outputs is None:
        return Response(status_code=499)  # the client left; nobody reads this
    out = outputs[0]
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": {"content": _logprobs(gen, c.token_ids, c.logprobs, k, req.return_tokens_as_token_ids)}
                if k is not None else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
               for c in out.outputs]
    return JSONResponse({"id": request_id, "object": "chat.completion", "created": created, "model": gen.model_name,
                         "choices": choices, "usage": usage([out])})


async def _stream(gen: Generation, req: ChatCompletionRequest, request_id: str, created: int, stream):
    choices: dict[int, ChoiceState] = {}
    k = (req.top_logprobs or 0) if req.logprobs else None
    include_usage = req.stream_options is not None and req.stream_options.usage_at_end
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": gen.model_name}
    usage_field = {"usage": None} if include_usage else {}
    last = None
    try:
        async for out in stream:
            last = out
            for c in out.outputs:  # delta outputs: one chunk per choice that advanced, as OpenAI streams them
                state = choices.setdefault(c.index, ChoiceState())
                if not state.started:  # OpenAI opens each choice with the role
                    state.started = True
                    yield sse({**head, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}], **usage_field})
                delta = {"content": c.text} if c.text else {}
                logprobs = ({"content": _logprobs(gen, c.token_ids, c.logprobs, k, req.return_tokens_as_token_ids)}
                            if k is not None else None)
                choice = {"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason}
                yield sse({**head, "choices": [choice], **usage_field})
        if include_usage and last is not None:
            yield sse({**head, "choices": [], "usage": usage([last])})
    except Exception as exc:  # the engine died mid-stream: say so in-band, then end the stream
        yield sse(error_body(503, str(exc)))
    yield sse("[DONE]")
