"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter, off unless the server was
started with --enable-lora-runtime-updates (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING), and behind --api-key like
every route but /health and /metrics.

A bad adapter (missing files, a pickle, shapes of another model, a rank over --max-lora-rank) is refused with 400
by the engine's own checks before any of it reaches a device; requests already running are not disturbed.
"""

from __future__ import annotations

import asyncio

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException

from railyard.api.errors import ERROR_RESPONSES, ModelNotFoundError
from railyard.api.lora import Adapters, LoRAModule, lora_request
from railyard.api.protocol import StrictModel
from railyard.engine.client.base import EngineClient
from railyard.errors import InvalidRequestError, UnknownLoRAError

RUNTIME_UPDATES_FLAG = "--enable-lora-runtime-updates"


class LoadLoRAAdapterRequest(StrictModel):
    """vLLM's body; base_model_name (railyard's) picks the model where a server serves several."""

    lora_name: str
    lora_path: str
    base_model_name: str | None = None


class UnloadLoRAAdapterRequest(StrictModel):
    """vLLM's body (its lora_int_id is accepted and must match the adapter's, where given)."""

    lora_name: str
    lora_int_id: int | None = None


@dataclass
class LoRAHost:
    """A served model that takes adapters: its adapters and the engine client that loads them."""

    adapters: Adapters
    client: EngineClient


async def load_adapter(host: LoRAHost, module: LoRAModule, reserved: set[str]) -> None:
    """Load one adapter into the model's engine and serve it by name; InvalidRequestError says why not."""
    host.adapters.check_new(module.name, reserved)
    request = await asyncio.to_thread(lora_request, module.name, module.path)  # reads the adapter's files
    await host.client.load_lora(request)
    host.adapters.add(request)


def install_lora_routes(app: FastAPI, hosts: Callable[[], dict[str, LoRAHost]], *, enabled: bool) -> None:
    """The two routes over {served model name: LoRAHost} (a callable: the hosts may be built at start-up)."""

    def check_enabled() -> None:
        if not enabled:
            raise HTTPException(404, f"Runtime LoRA adapter updates are off: start the server with "
                                     f"{RUNTIME_UPDATES_FLAG}.")

    def host_for(base_model_name: str | None) -> LoRAHost:
        served = hosts()
        if base_model_name is None:
            if len(served) != 1:
                raise InvalidRequestError(f"this server serves {', '.join(served)}: say which one the adapter is "
                                          "for in base_model_name")
            return next(iter(served.values()))
        host = served.get(base_model_name)
        if host is None:
            raise ModelNotFoundError(base_model_name)
        return host

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
              responses={s: ERROR_RESPONSES[s] for s in (400, 401, 404)})
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Response:
        check_enabled()
        if not body.lora_name or not body.lora_path:
            raise InvalidRequestError("Both 'lora_name' and 'lora_path' must be provided.")
        served = hosts()
        reserved = set(served) | {n for h in served.values() for n in h.adapters.by_name}
        await load_adapter(host_for(body.base_model_name), LoRAModule(body.lora_name, body.lora_path), reserved)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
              responses={s: ERROR_RESPONSES[s] for s in (400, 401, 404)})
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Response:
        check_enabled()
        host = next((h for h in hosts().values() if body.lora_name in h.adapters.by_name), None)
        if host is None:
            raise UnknownLoRAError(f"The lora adapter '{body.lora_name}' cannot be found.")
        request = host.adapters.by_name[body.lora_name]
        if body.lora_int_id is not None and body.lora_int_id != request.lora_int_id:
            raise InvalidRequestError(f"The lora adapter '{body.lora_name}' has id {request.lora_int_id}, "
                                      f"not {body.lora_int_id}.")
        await host.client.unload_lora(body.lora_name)  # requests running with it finish
        host.adapters.remove(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
