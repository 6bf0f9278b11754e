"""`build_app(args)`: the Ray Serve application (import path `railyard.serve.app:build_app`).

One engine deployment per model and length pool (named `engine-<model>-<pool>`, as
`railyard.stack` names them), each replica one engine (its core in its own process), routed by our request router and
scaled by our pending-requests policy; in front, the OpenAI ingress (the same FastAPI app as
`railyard serve`). A Ray Serve config file's `deployments` entries override these options by
name, so `serve run config.yaml` and a KubeRay RayService run the same application.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from railyard.serve.autoscaling import POLICY_IMPORT_PATH
from railyard.serve.ingress import OpenAIIngress
from railyard.serve.replica import EngineReplica
from railyard.serve.router import ROUTERS
from railyard.engine.config import EngineConfig
from railyard.serve.spec import AppSpec, PoolDeployment, ServedModel, parse_app_args


def build_app(args: dict[str, Any]) -> serve.Application:
    """The application for `args` (see railyard.serve.spec for the shape)."""
    spec = parse_app_args(args)
    engines = {pool.deployment: bind_engine(spec, model, pool) for model in spec.models for pool in model.pools}
    ingress = serve.deployment(OpenAIIngress).options(
        name=spec.ingress_name, num_replicas=spec.ingress_replicas,
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
    return ingress.bind(_routes(spec), engines, lora_runtime_updates=spec.lora_runtime_updates)


def _routes(spec: AppSpec) -> list[dict[str, Any]]:
    """What the ingress needs to build one engine client per model (plain data)."""
    return [{"name": m.name, "model": m.model,
             "pools": [{"name": p.name, "deployment": p.deployment, "max_prompt_tokens": p.max_prompt_tokens,
                        "max_model_len": p.engine.get("max_model_len"), "tokenizer": p.engine.get("tokenizer"),
                        **{k: p.engine[k] for k in ("reasoning_parser", "tool_call_parser") if k in p.engine}}
                       for p in m.pools],
             "lora": _lora_route(m)}
            for m in spec.models]


def _lora_route(model: ServedModel) -> dict[str, Any]:
    """A model's LoRA limits as every pool's engines take them (max_loras 0: no adapters), and its adapters."""
    configs = [EngineConfig(**p.engine) for p in model.pools]
    if not all(c.enable_lora for c in configs):
        return {"max_loras": 0, "max_lora_rank": 0, "adapters": []}
    return {"max_loras": min(c.max_loras for c in configs), "max_lora_rank": min(c.max_lora_rank for c in configs),
            "adapters": [{"name": n, "path": p} for n, p in model.adapters]}


def replica_resources(model: ServedModel, pool: PoolDeployment) -> dict[str, Any]:
    """ray_actor_options and, for tensor parallelism, STRICT_PACK placement-group bundles (all ranks on one node)."""
    on_cpu = pool.engine.get("device") == "cpu"
    gpu = 0 if on_cpu else 1
    options: dict[str, Any] = {"ray_actor_options": dict(pool.ray_actor_options or {"num_cpus": 1, "num_gpus": gpu})}
    tp = model.tensor_parallel_size
    if tp > 1:
        bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
        options["placement_group_bundles"] = [dict(bundle) for _ in range(tp)]
        options["placement_group_strategy"] = "STRICT_PACK"
    return options


def bind_engine(spec: AppSpec, model: ServedModel, pool: PoolDeployment) -> serve.Application:
    """The pool's engine deployment, bound to its engine options."""
    return engine_deployment(spec, model, pool).bind(pool.engine, max_waiting_requests=spec.max_waiting_requests,
                                                     stream_interval_s=model.stream_interval_s,
                                                     stream_items_per_s=model.stream_items_per_s,
                                                     **standby_options(pool))


def standby_options(pool: PoolDeployment) -> dict[str, int]:
    """The replica's standby engines and its pool's max_replicas (the replica bounds its GPU's engines by them)."""
    if pool.standby is None:
        return {}
    return {"standby_engines": pool.standby.engines, "standby_max_replicas": pool.standby.max_replicas}


def engine_deployment(spec: AppSpec, model: ServedModel, pool: PoolDeployment) -> serve.Deployment:
    """One model pool's engine deployment: our router, our autoscaling policy, GPUs or CPU per replica."""
    router = spec.router
    options: dict[str, Any] = {
        "name": pool.deployment,
        # Ray's default of 5 would starve continuous batching: admit what the engine can batch.
        "max_ongoing_requests": pool.max_ongoing_requests or EngineConfig(**pool.engine).max_num_seqs,
        "request_router_config": RequestRouterConfig(
            request_router_class=ROUTERS[router.name], request_router_kwargs=router.options,
            request_routing_stats_period_s=router.stats_period_s,
            request_routing_stats_timeout_s=max(5.0, 5 * router.stats_period_s)),
        **spec.lifecycle.model_dump(),
        **replica_resources(model, pool),
    }
    if pool.autoscaling is not None:
        options["autoscaling_config"] = autoscaling_config(pool)
    else:
        options["num_replicas"] = pool.num_replicas
    return serve.deployment(EngineReplica).options(**options)


def autoscaling_config(pool: PoolDeployment) -> AutoscalingConfig:
    """Ray's autoscaling_config running our pending-requests policy."""
    auto = pool.autoscaling
    import warnings

    with warnings.catch_warnings():  # metrics_interval_s is deprecated in favour of env vars, still honoured
        warnings.simplefilter("ignore", DeprecationWarning)
        return AutoscalingConfig(
            min_replicas=auto.min_replicas, max_replicas=auto.max_replicas, initial_replicas=auto.initial_replicas,
            target_ongoing_requests=auto.target_pending_per_replica, upscale_delay_s=auto.upscale_delay_s,
            downscale_delay_s=auto.downscale_delay_s, metrics_interval_s=auto.metrics_interval_s,
            look_back_period_s=auto.look_back_period_s, policy={"policy_function": POLICY_IMPORT_PATH})
