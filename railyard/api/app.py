"""The FastAPI app: OpenAI routes, /health, /metrics, wrapped in the size-limit and auth guards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from railyard.api.chat import create_chat_completion
from railyard.api.completions import create_completion
from railyard.api.errors import ERROR_RESPONSES, ModelNotFoundError, error_response, install_error_handlers
from railyard.api.generation import Generation
from railyard.api.lora import Adapters, LoRAModule
from railyard.api.lora_routes import LoRAHost, install_lora_routes, load_adapter
from railyard.api.metrics import ServerMetrics
from railyard.api.middleware import BearerAuth, BodySizeLimit
from railyard.api.protocol import ChatCompletionRequest, CompletionRequest
from railyard.api.sleep_routes import install_sleep_routes
from railyard.engine.client.base import EngineClient

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


def install_openai_routes(app: FastAPI, generation_for: Callable[[str | None], Generation]) -> None:
    """POST /v1/completions and /v1/chat/completions, each request handed to its model's Generation.

    generation_for raises ModelNotFoundError (404) for a model this app does not serve (400 for None where it
    serves several).
    """

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await create_completion(generation_for(body.model), body, raw)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(generation_for(body.model), body, raw)


def engine_app(engine: EngineClient, *, served_model_name: str | None = None, api_key: str | None = None,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, on_ready: Callable[[], None] | None = None,
               lora_modules: Sequence[LoRAModule] = (), lora_runtime_updates: bool = False,
               sleep_endpoints: bool = False) -> FastAPI:
    """The OpenAI app serving one `engine` (any EngineClient; serve.front.openai_app serves a fleet's models); its
    lifespan starts the client, loads the LoRA adapters of lora_modules (then calls on_ready: the server listens
    next) and shuts the engine down.

    lora_runtime_updates: /v1/load_lora_adapter and /v1/unload_lora_adapter may change the adapters.
    sleep_endpoints: /sleep, /wake_up and /is_sleeping are served (sleep_routes.py)."""
    info = engine.model_info
    name = served_model_name or info.served_model_name
    metrics = ServerMetrics(name, engine.stats, healthy=lambda: engine.is_running, startup=info.startup,
                            max_loras=info.max_loras)
    engine.listener = metrics
    gen = Generation(engine, name)
    host = LoRAHost(Adapters(name), engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await engine.start()
        for module in lora_modules:
            await load_adapter(host, module, {name})
        if on_ready is not None:
            on_ready()
        yield
        await engine.shutdown()

    app = FastAPI(title="railyard", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.engine, app.state.generation, app.state.metrics = engine, gen, metrics
    install_error_handlers(app)

    def generation_for(model: str | None) -> Generation:
        if model is None or model == name:  # as in vLLM, no model means the served one
            return gen
        lora = host.adapters.get(model)
        if lora is None:
            raise ModelNotFoundError(model)
        return gen.for_adapter(lora)

    install_openai_routes(app, generation_for)
    install_lora_routes(app, lambda: {name: host}, enabled=lora_runtime_updates)
    install_sleep_routes(app, engine, enabled=sleep_endpoints)

    def model_cards() -> list[dict]:
        base = {"id": name, "object": "model", "created": info.created, "owned_by": "railyard", "root": info.model,
                "parent": None, "max_model_len": info.max_model_len}
        return [base, *host.adapters.cards(info.created)]

    @app.get("/v1/models", responses={401: ERROR_RESPONSES[401]})
    async def models() -> dict:
        return {"object": "list", "data": model_cards()}

    @app.get("/v1/models/{model:path}", responses={s: ERROR_RESPONSES[s] for s in (401, 404)})
    async def model(model: str) -> dict:
        card = next((c for c in model_cards() if c["id"] == model), None)
        if card is None:
            raise ModelNotFoundError(model)
        return card

    @app.get("/health", responses={503: ERROR_RESPONSES[503]})
    async def health() -> Response:
        if engine.is_running:
            return JSONResponse({"status": "ok"})
        return error_response(503, str(engine.dead or "the engine loop is not running"))

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.stats = engine.stats
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)  # added last: runs first, before any body is read
    return app
