"""The OpenAI app over several Ray-served models: the front's own routes, errors and metrics, reused.

`railyard.api` serves one local engine client per app; here each request is dispatched by its
`model` to that model's `Generation`, whose engine client is a RayEngineClient (the same
EngineClient interface), or to one of its LoRA adapters. An unknown model is 404, /v1/models lists every model and
adapter, and /metrics carries each model's vLLM-named metrics plus the Ray-level ones (routing, replicas, scale
events).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from railyard.api.app import install_openai_routes
from railyard.api.errors import ModelNotFoundError, install_error_handlers
from railyard.api.generation import Generation
from railyard.api.lora import Adapters, LoRAModule
from railyard.api.lora_routes import LoRAHost, install_lora_routes, load_adapter
from railyard.api.metrics import ServerMetrics
from railyard.api.middleware import BearerAuth, BodySizeLimit
from railyard.serve.client import RayEngineClient

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


class _Merged(Collector):
    """Several registries as one exposition: same-named families from different models merged."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self):
        families = {}
        for registry in self.registries:
            for family in registry.collect():
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        return list(families.values())


def openai_app(clients: dict[str, RayEngineClient], *, on_startup: Callable[[], None] | None = None,
               on_shutdown: Callable[[], None] | None = None, api_key: str | None = None,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               lora_modules: dict[str, Sequence[LoRAModule]] | None = None,
               lora_runtime_updates: bool = False) -> FastAPI:
    """The OpenAI-compatible app over {served model name: RayEngineClient}; lora_modules: each model's adapters
    from the start; lora_runtime_updates: /v1/load_lora_adapter and /v1/unload_lora_adapter may change them."""
    gens = {name: Generation(client, name) for name, client in clients.items()}
    hosts = {name: LoRAHost(Adapters(name), client) for name, client in clients.items()}
    model_metrics = {}
    for name, client in clients.items():
        model_metrics[name] = ServerMetrics(name, client.stats, max_loras=client.model_info.max_loras)
        client.listener = model_metrics[name]
    exposition = CollectorRegistry(auto_describe=False)
    exposition.register(_Merged([m.registry for m in model_metrics.values()] + [REGISTRY]))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        reserved = set(clients)
        for name, modules in (lora_modules or {}).items():
            for module in modules:
                await load_adapter(hosts[name], module, reserved)
                reserved.add(module.name)
        if on_startup:
            on_startup()
        yield
        if on_shutdown:
            on_shutdown()

    app = FastAPI(title="railyard", summary="OpenAI-compatible LLM serving on Ray Serve", lifespan=lifespan)
    app.state.clients, app.state.generations = clients, gens
    install_error_handlers(app)

    def generation(model: str) -> Generation:
        gen = gens.get(model)
        if gen is not None:
            return gen
        for name, host in hosts.items():
            lora = host.adapters.get(model)
            if lora is not None:
                return gens[name].for_adapter(lora)
        raise ModelNotFoundError(model)

    install_openai_routes(app, generation)
    install_lora_routes(app, lambda: hosts, enabled=lora_runtime_updates)

    def model_cards() -> list[dict]:
        cards = []
        for name, client in clients.items():
            cards.append({"id": name, "object": "model", "created": 0, "owned_by": "railyard", "root": name,
                          "parent": None, "max_model_len": client.max_model_len,
                          "pools": [{"name": p.name, "max_prompt_tokens": p.max_prompt_tokens} for p in client.pools]})
            cards += hosts[name].adapters.cards(0)
        return cards

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": model_cards()}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        card = next((c for c in model_cards() if c["id"] == model), None)
        if card is None:
            raise ModelNotFoundError(model)
        return card

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok", "models": list(clients)})

    @app.get("/metrics")
    async def prometheus() -> Response:
        for name, client in clients.items():
            model_metrics[name].stats = client.stats
        return Response(generate_latest(exposition), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    return app
