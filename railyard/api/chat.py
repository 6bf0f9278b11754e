"""POST /v1/chat/completions: messages through the checkpoint's own chat template, n choices, optional SSE."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from railyard.api.errors import error_body
from railyard.api.generation import ChoiceState, Generation, Prompt, chunk_usage, now_s, usage
from railyard.api.protocol import ChatCompletionRequest
from railyard.api.sse import EventStreamResponse, sse
from railyard.api.structured import structured_outputs
from railyard.api.output_parsers import OutputParser, choice_parsers, finish_reason, parse_message, stream_delta
from railyard.api.tools import ToolPlan, plan_tools, template_messages
from railyard.errors import InvalidRequestError


async def render_chat(gen: Generation, req: ChatCompletionRequest, tools: ToolPlan | None = None) -> Prompt:
    """The prompt text and ids, exactly as transformers' apply_chat_template renders the messages (and tools)."""
    if getattr(gen.tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions")
    messages = template_messages(req.messages)
    try:
        text = gen.tokenizer.apply_chat_template(messages, tools=tools.tools if tools else None, tokenize=False,
                                                 **req.template_kwargs())
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
    tools = plan_tools(req, gen.parsers.harmony)  # [tools] None without tools
    constraint = structured_outputs(req, tools.constraint if tools else None)  # [structured outputs]
    prompt = await render_chat(gen, req, tools)
    max_tokens = req.max_completion_tokens or req.max_tokens
    gen.check_length(prompt, max_tokens)
    k = (req.top_logprobs or 0) if req.logprobs else None
    params = gen.sampling_params(req, max_tokens, k, constraint)
    # [reasoning, tools] one parser per choice, the same for the stream and the whole message
    json_output = constraint is not None and constraint.kind in ("json", "json_object")
    new_parser = choice_parsers(gen.parsers, req, tools, prompt.text, json_output)
    if gen.parsers.harmony:
        params.skip_special_tokens = False  # harmony's channels are special tokens: the parser reads them
    request_id = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
    streams = await gen.submit(request_id, [prompt], params, req.priority, arrival)
    created = now_s()
    if req.stream:
        return EventStreamResponse(_stream(gen, req, request_id, created, streams[0], new_parser), streams)
    outputs = await gen.collect(streams, raw)
    if outputs is None:
        return Response(status_code=499)  # the client left; nobody reads this
    out = outputs[0]
    choices = []
    for c in out.outputs:
        parser = new_parser() if new_parser else None
        message = {"role": "assistant", "content": c.text}
        if parser is not None:
            message.update(parse_message(parser, c.text).fields(req.include_reasoning))
        logprobs = ({"content": _logprobs(gen, c.token_ids, c.logprobs, k, req.return_tokens_as_token_ids)}
                    if k is not None else None)
        choices.append({"index": c.index, "message": message, "logprobs": logprobs,
                        "finish_reason": finish_reason(c.finish_reason, parser), "stop_reason": c.stop_reason})
    return JSONResponse({"id": request_id, "object": "chat.completion", "created": created, "model": gen.model_name,
                         "choices": choices, "usage": usage([out])})


async def _stream(gen: Generation, req: ChatCompletionRequest, request_id: str, created: int, stream,
                  new_parser: Callable[[], OutputParser] | None = None):
    choices: dict[int, ChoiceState] = {}
    parsers = {i: new_parser() for i in range(req.n)} if new_parser else {}  # [reasoning, tools] one per choice
    k = (req.top_logprobs or 0) if req.logprobs else None
    include_usage = req.stream_options is not None and req.stream_options.usage_at_end
    every_chunk = req.stream_options is not None and req.stream_options.usage_in_every_chunk
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": gen.model_name}
    usage_field = {"usage": None} if include_usage else {}
    last = None
    try:
        async for out in stream:
            last = out
            for c in out.outputs:  # delta outputs: one chunk per choice that advanced, as OpenAI streams them
                state = choices.setdefault(c.index, ChoiceState())
                prompt_tokens = out.metrics.num_prompt_tokens
                if not state.started:  # OpenAI opens each choice with the role
                    state.started = True
                    role_usage = {"usage": chunk_usage(prompt_tokens, 0)} if every_chunk else usage_field
                    yield sse({**head, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}], **role_usage})
                delta = {"content": c.text} if c.text else {}
                parser = parsers.get(c.index)
                if parser is not None:  # [reasoning, tools] reasoning, content and tool-call deltas
                    delta = stream_delta(parser, c.text, c.finish_reason is not None, req.include_reasoning)
                logprobs = ({"content": _logprobs(gen, c.token_ids, c.logprobs, k, req.return_tokens_as_token_ids)}
                            if k is not None else None)
                choice = {"index": c.index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": finish_reason(c.finish_reason, parser), "stop_reason": c.stop_reason}
                state.tokens += len(c.token_ids)
                chunk_field = {"usage": chunk_usage(prompt_tokens, state.tokens)} if every_chunk else usage_field
                yield sse({**head, "choices": [choice], **chunk_field})
        if include_usage and last is not None:
            yield sse({**head, "choices": [], "usage": usage([last])})
    except Exception as exc:  # the engine died mid-stream: say so in-band, then end the stream
        yield sse(error_body(400 if isinstance(exc, InvalidRequestError) else 503, str(exc)))
    yield sse("[DONE]")
