"""OpenAI-style error bodies and the handlers that turn every failure into one (never a bare 500)."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from railyard.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError

log = logging.getLogger("railyard.api")

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable_error"}


class ModelNotFoundError(Exception):
    """The request names a model this server does not serve (HTTP 404)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param=param, code=code), status_code=status, headers=headers)


def error_bytes(status: int, message: str, **kwargs) -> bytes:
    """The same body, encoded, for raw ASGI middleware and SSE error events."""
    return json.dumps(error_body(status, message, **kwargs)).encode()


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    # Like OpenAI, name an unrecognised argument before any bad value.
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        return ("We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
                "HTTP library correctly. The OpenAI API expects a JSON payload.)"), None
    if err.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", loc[-1] if loc else None
    if err.get("type") == "missing" and not loc:
        return "The request body is missing: send a JSON object.", None
    field = loc[0] if loc else "body"  # deeper parts name union members and list positions, not fields
    return f"Invalid value for '{field}': {err.get('msg', 'invalid')}.", field


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception the app can raise to an OpenAI-style body with the right status."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.method == "POST" and "json" not in request.headers.get("content-type", ""):
            # FastAPI only parses declared JSON; say so rather than "not a valid dictionary".
            return error_response(400, "Send the request body as JSON with 'Content-Type: application/json'.")
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(InvalidRequestError)
    async def _bad_request(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(ModelNotFoundError)
    async def _no_model(_: Request, exc: ModelNotFoundError) -> JSONResponse:
        return error_response(404, str(exc), param="model", code="model_not_found")

    @app.exception_handler(EngineOverloadedError)
    async def _overloaded(_: Request, exc: EngineOverloadedError) -> JSONResponse:
        return error_response(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error while serving a request")
        return error_response(500, f"internal error: {type(exc).__name__}")
