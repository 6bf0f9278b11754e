"""The OpenAI ingress deployment: the same FastAPI app as `railyard serve`, its engines remote.

Each served model gets a RayEngineClient over its pools' deployment handles; the app's routes,
errors, streaming and /metrics are the front's own. Ray-level metrics (routing decisions,
replicas per deployment, scale events) are appended to /metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ray import serve

from railyard.api.lora import LoRAModule
from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir
from railyard.engine.tokenizer import load_tokenizer
from railyard.model.spec import ModelSpec, read_model_spec
from railyard.serve.client import PoolHandle, RayEngineClient
from railyard.serve.logs import log_where_serve_logs
from railyard.serve.metrics import ReplicaWatcher
from railyard.shapes import is_shape, shape_config

log = logging.getLogger("railyard.serve")


def make_clients(routes: list[dict[str, Any]], handles: dict[str, Any]) -> dict[str, RayEngineClient]:
    """One engine client per served model, its pools in prompt-length order."""
    clients = {}
    for route in routes:
        tokenizer_dir = next((p["tokenizer"] for p in route["pools"] if p.get("tokenizer")), None)
        if is_shape(route["model"]) and not Path(route["model"]).exists():
            # A named shape with random weights (GPU benchmarks): its replicas speak the embedded model's
            # byte-level tokenizer unless the pool names one (railyard.engine.tokenizer.with_shape_tokenizer).
            # torch, imported only for this case
            from railyard.engine.startup.tiny_model import ensure_tiny_model

            spec = ModelSpec.from_hf_config(shape_config(route["model"]))
            tokenizer_dir = tokenizer_dir or ensure_tiny_model()
        else:
            model_dir = resolve_model_dir(route["model"])
            spec = read_model_spec(model_dir)
            tokenizer_dir = tokenizer_dir or model_dir
        pools = [PoolHandle(p["name"], p["max_prompt_tokens"], handles[p["deployment"]],
                      p.get("max_model_len") or spec.max_position_embeddings) for p in route["pools"]]
        # The front's chat parsers, as the model's engine options name them (pools share them; "auto" if unset).
        parsers = {k: next((p[k] for p in route["pools"] if k in p), "auto")
                   for k in ("reasoning_parser", "tool_call_parser")}
        lora = route.get("lora") or {}  # the replicas' LoRA limits (max_loras 0: no adapters)
        clients[route["name"]] = RayEngineClient(
            route["name"], pools, load_tokenizer(tokenizer_dir),
            max_model_len=max(p.max_model_len for p in pools), vocab_size=spec.vocab_size, model=route["model"],
            tokenizer_path=str(tokenizer_dir), **parsers, spec=spec, max_loras=lora.get("max_loras", 0),
            max_lora_rank=lora.get("max_lora_rank", 0))
    return clients


@serve.ingress()
class OpenAIIngress:
    """Ingress replica: builds the engine clients, then the OpenAI app over them."""

    def __init__(self, routes: list[dict[str, Any]], engines: dict[str, Any],
                 lora_runtime_updates: bool = False) -> None:
        log_where_serve_logs()
        self.clients = make_clients(routes, engines)
        self.lora_modules = {r["name"]: [LoRAModule(a["name"], a["path"]) for a in (r.get("lora") or {}).get(
            "adapters", [])] for r in routes}
        self.lora_runtime_updates = lora_runtime_updates
        context = serve.get_replica_context()
        self.watcher = ReplicaWatcher(context.app_name, list(engines))

    def __serve_build_asgi_app__(self):
        from railyard.serve.front import openai_app

        return openai_app(self.clients, on_startup=self.watcher.start, on_shutdown=self.watcher.stop,
                          lora_modules=self.lora_modules, lora_runtime_updates=self.lora_runtime_updates)
