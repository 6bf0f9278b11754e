"""OpenAI-style error bodies, the handlers that turn every failure into one (never a bare 500), and
their declaration in the OpenAPI schema."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from railyard.api.protocol import REQUEST_RULE, format_path
from railyard.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError, UnknownLoRAError

log = logging.getLogger("railyard.api")

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable_error"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response, as OpenAI sends it."""

    error: ErrorDetail


# For the routes' `responses=`: what each error status means here, with the body's model.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request: unparsable JSON, a wrong, unknown or unsupported "
                                                 "field, invalid Unicode, or a prompt longer than the context"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (servers started with --api-key)"},
    404: {"model": ErrorResponse, "description": "The model (or LoRA adapter) is not served here"},
    413: {"model": ErrorResponse, "description": "The request body is over the server's size limit"},
    503: {"model": ErrorResponse, "description": "Overloaded (retry after the Retry-After header's seconds) or the "
                                                 "engine has died"},
}


class ModelNotFoundError(Exception):
    """The request names a model this server does not serve (HTTP 404), or none where it must (HTTP 400)."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        super().__init__("you must provide a model parameter" if model is None
                         else f"The model `{model}` does not exist.")


class ErrorJSONResponse(JSONResponse):
    """A JSON response that always renders: text that UTF-8 cannot carry (a lone surrogate) goes \\u-escaped."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return ErrorJSONResponse(error_body(status, message, param=param, code=code), status_code=status, headers=headers)


def error_bytes(status: int, message: str, **kwargs) -> bytes:
    """The same body, encoded, for raw ASGI middleware and SSE error events."""
    return json.dumps(error_body(status, message, **kwargs)).encode()


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    # Like OpenAI, name an unrecognised argument before any bad value.
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = [p for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        return ("We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
                "HTTP library correctly. The OpenAI API expects a JSON payload.)"), None
    if err.get("type") == REQUEST_RULE:  # railyard's own rule: the message is final, the param relative to loc
        relative = err.get("ctx", {}).get("param")
        param = format_path([*loc, relative] if relative else loc)
        return err["msg"] if not loc else f"Invalid '{format_path(loc)}': {err['msg']}", param or None
    if err.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {format_path(loc)}", str(loc[-1]) if loc else None
    if err.get("type") == "missing" and not loc:
        return "The request body is missing: send a JSON object.", None
    field = str(loc[0]) if loc else "body"  # deeper parts name union members and list positions, not fields
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

    @app.exception_handler(UnknownLoRAError)
    async def _no_adapter(_: Request, exc: UnknownLoRAError) -> JSONResponse:
        return error_response(404, str(exc), param="model", code="model_not_found")

    @app.exception_handler(ModelNotFoundError)
    async def _no_model(_: Request, exc: ModelNotFoundError) -> JSONResponse:
        if exc.model is None:
            return error_response(400, str(exc), param="model")
        return error_response(404, str(exc), param="model", code="model_not_found")

    @app.exception_handler(EngineOverloadedError)
    async def _overloaded(_: Request, exc: EngineOverloadedError) -> JSONResponse:
        return error_response(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):  # FastAPI's "error parsing the body", for bytes that are not UTF-8
            return error_response(400, f"The request body is not valid UTF-8 (byte {cause.start}: "
                                       f"{cause.object[cause.start:cause.end]!r}); send JSON as UTF-8.")
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after sending this, and uvicorn then closes the socket: say so, or a client
        # that pools keep-alive connections sends its next request into a reset.
        log.exception("unexpected error while serving a request")
        return error_response(500, f"internal error: {type(exc).__name__}", headers={"Connection": "close"})

    _document_errors(app)


def _document_errors(app: FastAPI) -> None:
    """The schema says what the server sends: validation failures are 400 (declared per route), never 422."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
                schemas.pop("HTTPValidationError", None)
                schemas.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
