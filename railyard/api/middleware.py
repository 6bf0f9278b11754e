"""Raw ASGI guards in front of the app: a request-body size limit (413) and Bearer-token auth (401)."""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from railyard.api.errors import error_bytes


async def _send_error(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """Refuses bodies over max_bytes with 413 before the app parses them (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = error_bytes(413, f"The request body exceeds the limit of {self.max_bytes} bytes.")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _send_error(send, 413, too_big)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await _send_error(send, 413, too_big)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body_message: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            # The buffered body once, then the real channel (which reports the client's disconnect).
            nonlocal body_message
            if body_message is not None:
                message, body_message = body_message, None
                return message
            return await receive()

        await self.app(scope, replay, send)


# Open without a key, for probes and scrapers; everything else (the /v1 API, /docs, /redoc, /openapi.json and any
# route added later) requires it.
OPEN_PATHS = frozenset({"/health", "/metrics"})


class BearerAuth:
    """Requires `Authorization: Bearer <key>` on every route but /health and /metrics (the API docs included:
    fetch /openapi.json with the header)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                body = error_bytes(401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                                   code="invalid_api_key")
                return await _send_error(send, 401, body, [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)
