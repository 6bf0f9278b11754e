"""The serve application's arguments (`args` of the Ray Serve config), validated once into plain data.

The shape is what `railyard.stack.to_serve_config` writes:
`{"models": [{"name", "model", "tensor_parallel_size", "engine", "autoscaling"?, "stream_interval_s"?,
"stream_items_per_s"?, "pools": [{"name", "max_prompt_tokens", "deployment", "engine"}]}], "ingress": {"num_replicas"}}`.
Optional extras, for running without a stack file: per pool `num_replicas`, `autoscaling`, `ray_actor_options`,
`max_ongoing_requests`; top level `router` (name and options), `replica` (health checks, graceful shutdown, stats
periods) and the ingress's `name`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from railyard.engine.config import EngineConfig
from railyard.errors import ConfigError
from railyard.stack import Ingress

INGRESS_NAME = "openai-ingress"
# A replica sends a stream's first output at once, then at most one merged output per this interval, and the
# final one at once. Every Ray stream item costs the replica, the ingress and the proxy CPU, whatever it
# carries: one item per token caps the whole Ray path near 2k tokens/s (ray #52745). 50 ms is Ray Serve LLM's
# stream batching interval; a reader sees tokens in small bursts, TTFT and the end of a request are not delayed.
DEFAULT_STREAM_INTERVAL_S = 0.05
# ... and with many streams the interval grows to live streams / this budget, so a replica yields about this many
# items per second in all however many streams it serves: at 50 ms, 128 streams on one replica would send 2,560
# items/s, more than one ingress and the proxy relay (on the H200 host the Ray path relayed ~1,300 items/s through
# one ingress before it set the pace: 30% of the direct server at 256 streams). 500 keeps 50 ms up to 25 streams
# per replica; 128 streams get an item every 0.26 s, each carrying what the engine made meanwhile. 0: no budget.
DEFAULT_STREAM_ITEMS_PER_S = 500.0
# Every token of every stream crosses the ingress twice (in from a replica, out to the proxy): one ingress process
# may saturate a core before the engines do (ray #52746), and more replicas spread that load. One by default until
# the front's /metrics has a fleet view: it is per ingress process, so with several a scrape through the proxy sees
# one ingress's counters at a time (on the H200 a second ingress took 256 streams from 58% to 69% of direct). The
# number is the stack file's default (stack.Ingress), written once.
DEFAULT_INGRESS_REPLICAS: int = Ingress.model_fields["num_replicas"].default
ROUTER_NAMES = ("pending_prefix", "round_robin", "power_of_two")
_ENGINE_FIELDS = set(EngineConfig.option_names())
_AUTOSCALING_KEYS = {"min_replicas", "max_replicas", "target_pending_per_replica", "upscale_delay_s",
                     "downscale_delay_s", "metrics_interval_s", "look_back_period_s", "initial_replicas"}


@dataclass(frozen=True)
class AutoscalingSpec:
    """Scale on pending requests per replica; delays are how long the signal must hold."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_pending_per_replica: float = 8.0
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0
    metrics_interval_s: float = 1.0  # how often replicas push their pending count
    look_back_period_s: float = 3.0  # the window the pending count is averaged over
    initial_replicas: int | None = None


@dataclass(frozen=True)
class PoolSpec:
    name: str
    deployment: str
    max_prompt_tokens: int | None
    engine: dict[str, Any]
    num_replicas: int = 1
    autoscaling: AutoscalingSpec | None = None
    ray_actor_options: dict[str, Any] | None = None
    max_ongoing_requests: int | None = None  # default: the engine's max_num_seqs


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str
    tensor_parallel_size: int
    pools: list[PoolSpec]
    stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S
    stream_items_per_s: float = DEFAULT_STREAM_ITEMS_PER_S


@dataclass(frozen=True)
class RouterSpec:
    name: str = "pending_prefix"
    options: dict[str, Any] = field(default_factory=dict)
    stats_period_s: float = 1.0  # how often replicas report EngineStats + prefix hashes to routers


@dataclass(frozen=True)
class ReplicaSpec:
    health_check_period_s: float = 5.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 300.0  # a draining replica finishes its generations first
    graceful_shutdown_wait_loop_s: float = 0.5
    max_waiting_requests: int = 1024


@dataclass(frozen=True)
class AppSpec:
    models: list[ModelSpec]
    router: RouterSpec = RouterSpec()
    replica: ReplicaSpec = ReplicaSpec()
    ingress_name: str = INGRESS_NAME
    ingress_replicas: int = DEFAULT_INGRESS_REPLICAS

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
    replica = _known(ReplicaSpec, args.get("replica") or {}, "replica")
    ingress = args.get("ingress") or {}
    replicas = int(ingress.get("num_replicas", DEFAULT_INGRESS_REPLICAS))
    if replicas < 1:
        raise ConfigError(f"ingress.num_replicas must be >= 1, got {replicas}")
    return AppSpec(models, router, replica, ingress.get("name", INGRESS_NAME), replicas)


def _model(raw: Any, i: int) -> ModelSpec:
    where = f"models[{i}]"
    if not isinstance(raw, dict) or not raw.get("name") or not raw.get("model"):
        raise ConfigError(f"{where} needs 'name' and 'model'")
    name, path = str(raw["name"]), str(raw["model"])
    tp = int(raw.get("tensor_parallel_size", 1))
    base_engine = dict(raw.get("engine") or {})
    model_auto = raw.get("autoscaling")
    raw_pools = raw.get("pools") or [{"name": "default", "max_prompt_tokens": None,
                                      "deployment": f"engine-{name}-default"}]
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
        autoscaling = _autoscaling(auto_raw, pwhere) if auto_raw else None
        limit = p.get("max_prompt_tokens")
        pools.append(PoolSpec(str(p["name"]), str(p.get("deployment") or f"engine-{name}-{p['name']}"),
                              int(limit) if limit is not None else None, engine,
                              int(p.get("num_replicas", raw.get("num_replicas", 1))), autoscaling,
                              p.get("ray_actor_options"), p.get("max_ongoing_requests")))
    limits = [p.max_prompt_tokens for p in pools]
    if any(limit is None for limit in limits[:-1]):
        raise ConfigError(f"{where}.pools: only the last pool may omit max_prompt_tokens")
    interval = float(raw.get("stream_interval_s", DEFAULT_STREAM_INTERVAL_S))
    if interval < 0:
        raise ConfigError(f"{where}.stream_interval_s must be >= 0, got {interval}")
    budget = float(raw.get("stream_items_per_s", DEFAULT_STREAM_ITEMS_PER_S))
    if budget < 0:
        raise ConfigError(f"{where}.stream_items_per_s must be >= 0, got {budget}")
    return ModelSpec(name, path, tp, pools, interval, budget)


def _autoscaling(raw: Any, where: str) -> AutoscalingSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}.autoscaling must be a mapping")
    spec = _known(AutoscalingSpec, {k: v for k, v in raw.items() if k in _AUTOSCALING_KEYS}, f"{where}.autoscaling")
    if spec.max_replicas < spec.min_replicas:
        raise ConfigError(f"{where}.autoscaling: max_replicas ({spec.max_replicas}) < min_replicas ({spec.min_replicas})")
    if spec.target_pending_per_replica <= 0:
        raise ConfigError(f"{where}.autoscaling: target_pending_per_replica must be > 0")
    return spec


def _router(raw: dict[str, Any]) -> RouterSpec:
    name = raw.get("name", "pending_prefix")
    if name not in ROUTER_NAMES:
        raise ConfigError(f"router.name must be one of {', '.join(ROUTER_NAMES)}, got {name!r}")
    return RouterSpec(name, dict(raw.get("options") or {}), float(raw.get("stats_period_s", 1.0)))


def _known(cls, raw: dict[str, Any], where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return cls(**raw)
