"""The serve application's arguments (`args` of the Ray Serve config), validated once into plain data.

The shape is what `railyard.stack.to_serve_config` writes:
`{"models": [{"name", "model", "tensor_parallel_size", "engine", "stream_interval_s"?, "stream_items_per_s"?,
"pools": [{"name", "max_prompt_tokens", "deployment", "engine", "standby"?}]}], "ingress": {"num_replicas"}}`.
A pool's `standby` ({"engines", "max_replicas"}) is what its replicas need of autoscaling.standby_engines.
Optional extras, for running without a stack file: per pool `num_replicas`, `autoscaling`, `ray_actor_options`,
`max_ongoing_requests`; top level `router` (name and options), `replica` (the stack's lifecycle options and
max_waiting_requests) and the ingress's `name`. A model's `lora: {"adapters": [{"name", "path"}]}` serves LoRA
adapters from the start (and turns its engines' enable_lora on); the ingress's `lora_runtime_updates` lets
/v1/load_lora_adapter and /v1/unload_lora_adapter change them. Every default is the stack schema's (railyard.stack),
or the engine's (EngineConfig) for engine options, whether a stack file wrote the args or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from railyard.engine.client.base import DEFAULT_MAX_WAITING_REQUESTS
from railyard.engine.config import EngineConfig
from railyard.errors import ConfigError
from railyard.stack import Autoscaling, Ingress, Lifecycle, StackModel, deployment_name, standby_engines

INGRESS_NAME = "openai-ingress"
DEFAULT_STREAM_INTERVAL_S: float = StackModel.model_fields["stream_interval_s"].default
DEFAULT_STREAM_ITEMS_PER_S: float = StackModel.model_fields["stream_items_per_s"].default
DEFAULT_INGRESS_REPLICAS: int = Ingress.model_fields["num_replicas"].default
DEFAULT_NUM_REPLICAS: int = StackModel.model_fields["num_replicas"].default
ROUTER_NAMES = ("pending_prefix", "round_robin", "power_of_two")
_ENGINE_FIELDS = set(EngineConfig.option_names())


@dataclass(frozen=True)
class Standby:
    """A pool's standby engines (autoscaling.standby_engines) and its max_replicas, which bounds the engines one GPU
    holds for it (serve/standby.py standby_slots)."""

    engines: int
    max_replicas: int


@dataclass(frozen=True)
class PoolDeployment:
    """One length pool of a served model: its engine deployment and that deployment's engine options."""

    name: str
    deployment: str
    max_prompt_tokens: int | None
    engine: dict[str, Any]
    num_replicas: int = 1
    autoscaling: Autoscaling | None = None
    ray_actor_options: dict[str, Any] | None = None
    max_ongoing_requests: int | None = None  # default: the engine's max_num_seqs
    standby: Standby | None = None


@dataclass(frozen=True)
class ServedModel:
    """One model of the serve app, with its pools' deployments (a stack's StackModel, resolved)."""

    name: str
    model: str
    tensor_parallel_size: int
    pools: list[PoolDeployment]
    stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S
    stream_items_per_s: float = DEFAULT_STREAM_ITEMS_PER_S
    adapters: list[tuple[str, str]] = field(default_factory=list)  # LoRA adapters from the start: (name, path)


@dataclass(frozen=True)
class RouterSpec:
    name: str = "pending_prefix"
    options: dict[str, Any] = field(default_factory=dict)
    stats_period_s: float = 1.0  # how often replicas report EngineStats + prefix hashes to routers


@dataclass(frozen=True)
class AppSpec:
    models: list[ServedModel]
    router: RouterSpec = RouterSpec()
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    ingress_name: str = INGRESS_NAME
    ingress_replicas: int = DEFAULT_INGRESS_REPLICAS
    lora_runtime_updates: bool = False

    def deployments(self) -> list[str]:
        return [p.deployment for m in self.models for p in m.pools]


def parse_app_args(args: dict[str, Any]) -> AppSpec:
    """Validate `args`; every problem is a ConfigError naming the field."""
    if not isinstance(args, dict) or not isinstance(args.get("models"), list) or not args["models"]:
        raise ConfigError("serve app args need 'models': a non-empty list (see railyard.stack.to_serve_config)")
    models = [_model(m, i) for i, m in enumerate(args["models"])]
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique, got {names}")
    deployments = [p.deployment for m in models for p in m.pools]
    if len(set(deployments)) != len(deployments):
        raise ConfigError(f"deployment names must be unique, got {deployments}")
    router = _router(args.get("router") or {})
    replica = dict(args.get("replica") or {})
    waiting = int(replica.pop("max_waiting_requests", DEFAULT_MAX_WAITING_REQUESTS))
    if waiting < 1:
        raise ConfigError(f"replica.max_waiting_requests must be >= 1, got {waiting}")
    lifecycle = _validated(Lifecycle, replica, "replica")
    ingress = args.get("ingress") or {}
    replicas = int(ingress.get("num_replicas", DEFAULT_INGRESS_REPLICAS))
    if replicas < 1:
        raise ConfigError(f"ingress.num_replicas must be >= 1, got {replicas}")
    runtime_updates = ingress.get("lora_runtime_updates", False)
    if not isinstance(runtime_updates, bool):
        raise ConfigError(f"ingress.lora_runtime_updates must be true or false, got {runtime_updates!r}")
    return AppSpec(models, router, lifecycle, waiting, ingress.get("name", INGRESS_NAME), replicas, runtime_updates)


def _model(raw: Any, i: int) -> ServedModel:
    where = f"models[{i}]"
    if not isinstance(raw, dict) or not raw.get("name") or not raw.get("model"):
        raise ConfigError(f"{where} needs 'name' and 'model'")
    name, path = str(raw["name"]), str(raw["model"])
    tp = int(raw.get("tensor_parallel_size", 1))
    base_engine = dict(raw.get("engine") or {})
    adapters = _adapters(raw.get("lora"), where)
    if adapters is not None:
        base_engine["enable_lora"] = True
    model_auto = raw.get("autoscaling")
    raw_pools = raw.get("pools") or [{"name": "default", "max_prompt_tokens": None,
                                      "deployment": deployment_name(name, None)}]
    replicas = raw.get("num_replicas", DEFAULT_NUM_REPLICAS)
    pools = []
    for j, p in enumerate(raw_pools):
        pwhere = f"{where}.pools[{j}]"
        if not isinstance(p, dict) or not p.get("name"):
            raise ConfigError(f"{pwhere} needs a 'name'")
        engine = {**base_engine, **(p.get("engine") or {})}
        engine.setdefault("tensor_parallel_size", tp)
        engine["model"] = path
        engine.setdefault("served_model_name", name)
        unknown = sorted(set(engine) - _ENGINE_FIELDS)
        if unknown:
            raise ConfigError(f"{pwhere}.engine: unknown option(s) {', '.join(unknown)}; "
                              f"engine options are {', '.join(sorted(_ENGINE_FIELDS))}")
        EngineConfig(**engine)  # validate now, at the edge, not in a replica's constructor
        auto_raw = p.get("autoscaling", model_auto)
        autoscaling = _validated(Autoscaling, auto_raw, f"{pwhere}.autoscaling") if auto_raw else None
        limit = p.get("max_prompt_tokens")
        pools.append(PoolDeployment(str(p["name"]), str(p.get("deployment") or deployment_name(name, p["name"])),
                                    int(limit) if limit is not None else None, engine,
                                    int(p.get("num_replicas", replicas)), autoscaling,
                                    p.get("ray_actor_options"), p.get("max_ongoing_requests"),
                                    _standby(p.get("standby"), autoscaling, p.get("ray_actor_options"), pwhere)))
    limits = [p.max_prompt_tokens for p in pools]
    if any(limit is None for limit in limits[:-1]):
        raise ConfigError(f"{where}.pools: only the last pool may omit max_prompt_tokens")
    interval = float(raw.get("stream_interval_s", DEFAULT_STREAM_INTERVAL_S))
    if interval < 0:
        raise ConfigError(f"{where}.stream_interval_s must be >= 0, got {interval}")
    budget = float(raw.get("stream_items_per_s", DEFAULT_STREAM_ITEMS_PER_S))
    if budget < 0:
        raise ConfigError(f"{where}.stream_items_per_s must be >= 0, got {budget}")
    return ServedModel(name, path, tp, pools, interval, budget, adapters or [])


def _standby(raw: Any, autoscaling: Autoscaling | None, actor_options: dict[str, Any] | None,
             where: str) -> Standby | None:
    """A pool's `standby` ({"engines", "max_replicas"}, as a stack writes it), else its autoscaling's (unset: by
    the GPU share its ray_actor_options ask for, a whole GPU without them, as the stack resolves it)."""
    if raw is None:
        gpus = (actor_options or {}).get("num_gpus", 1.0)
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)):
            raise ConfigError(f"{where}.ray_actor_options.num_gpus must be a number, got {gpus!r}")
        engines = standby_engines(autoscaling, float(gpus))
        return Standby(engines, autoscaling.max_replicas) if autoscaling is not None and engines else None
    if not isinstance(raw, dict) or set(raw) != {"engines", "max_replicas"} or not isinstance(raw["engines"], int):
        raise ConfigError(f"{where}.standby must be {{\"engines\": N, \"max_replicas\": M}}")
    auto = _validated(Autoscaling, {"standby_engines": raw["engines"], "max_replicas": raw["max_replicas"]},
                      f"{where}.standby")
    return Standby(auto.standby_engines, auto.max_replicas) if auto.standby_engines else None


def _adapters(raw: Any, where: str) -> list[tuple[str, str]] | None:
    """A model's LoRA adapters as (name, path); None where it has no `lora`."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"adapters"} or not isinstance(raw.get("adapters", []), list):
        raise ConfigError(f"{where}.lora must be {{\"adapters\": [{{\"name\": ..., \"path\": ...}}]}}")
    out = []
    for k, a in enumerate(raw.get("adapters", [])):
        if not isinstance(a, dict) or set(a) != {"name", "path"} or not all(isinstance(v, str) and v
                                                                               for v in a.values()):
            raise ConfigError(f"{where}.lora.adapters[{k}] needs a 'name' and a 'path' (strings)")
        out.append((a["name"], a["path"]))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.lora.adapters: names must be unique, got {names}")
    return out


def _router(raw: dict[str, Any]) -> RouterSpec:
    name = raw.get("name", "pending_prefix")
    if name not in ROUTER_NAMES:
        raise ConfigError(f"router.name must be one of {', '.join(ROUTER_NAMES)}, got {name!r}")
    return RouterSpec(name, dict(raw.get("options") or {}), float(raw.get("stats_period_s", 1.0)))


def _validated(schema, raw: Any, where: str):
    """`raw` as the stack schema's class (one set of defaults); its first problem is a ConfigError naming the field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}{'.' + field_name if field_name else ''}: {err['msg']}") from None
