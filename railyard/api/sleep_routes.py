"""vLLM's sleep-mode routes: POST /sleep?level=1|2, POST /wake_up (?tags=weights&tags=kv_cache), GET /is_sleeping.

Off unless the server was started with --enable-sleep-endpoints (vLLM serves them in its dev mode only,
VLLM_SERVER_DEV_MODE): a client that reaches them can take the model off the GPU. Behind --api-key like every route
but /health and /metrics. The flag turns the engine's --enable-sleep-mode on;
the engine refuses to sleep while requests run or wait, and
requests sent while it sleeps wait for /wake_up (as vLLM's paused engine holds them).
"""

from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from railyard.api.errors import ERROR_RESPONSES
from railyard.engine.client.base import CoreClient

SLEEP_ENDPOINTS_FLAG = "--enable-sleep-endpoints"


def install_sleep_routes(app: FastAPI, engine: CoreClient, *, enabled: bool) -> None:
    """The three routes over one engine client."""

    def check_enabled() -> None:
        if not enabled:
            raise HTTPException(404, f"The sleep-mode endpoints are off: start the server with {SLEEP_ENDPOINTS_FLAG}.")

    responses = {s: ERROR_RESPONSES[s] for s in (400, 401, 404)}

    @app.post("/sleep", responses=responses)
    async def sleep(
            level: int = Query(1, description="1: weights kept in host memory; 2: weights discarded")) -> Response:
        check_enabled()
        await engine.sleep(level)
        return Response(status_code=200)

    @app.post("/wake_up", responses=responses)
    async def wake_up(
            tags: list[str] | None = Query(None, description="weights, kv_cache (default: both)")) -> Response:
        check_enabled()
        await engine.wake_up(tags)
        return Response(status_code=200)

    @app.get("/is_sleeping", responses={s: ERROR_RESPONSES[s] for s in (401, 404)})
    async def is_sleeping() -> JSONResponse:
        check_enabled()
        return JSONResponse({"is_sleeping": await engine.is_sleeping()})
