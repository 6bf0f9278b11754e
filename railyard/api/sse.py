"""Server-sent events that stop generating the moment the client goes away."""

from __future__ import annotations

import json

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send



def sse(data: dict | str) -> str:
    """One `data:` event (the OpenAI stream format)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that always watches for disconnect and always closes its generator.

    Starlette, on ASGI 2.4 servers, notices a departed client only at its next write; a request still
    waiting for its first token would keep its place (and its KV blocks) until then. Here the end of the
    response, however it comes, aborts every unfinished engine request at once.
    """

    def __init__(self, content, streams: list, **kwargs) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, **kwargs)
        self.streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
            for stream in self.streams:  # also when the generator never started (its finally never ran)
                stream.abort()
