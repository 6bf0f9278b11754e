"""What `railyard cluster up` checks before it deploys, so a stack that cannot come up says why in seconds:
each model's checkpoint (on this machine, before Ray starts), and whether the replicas' resource asks fit in the
Ray cluster at all (Ray Serve would otherwise leave them pending, and say so only in its controller's log)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir, weight_files
from railyard.errors import ConfigError, ModelLoadError
from railyard.model.spec import read_model_spec
from railyard.shapes import is_shape


def check_local_models(stack) -> None:
    """Each model's checkpoint directory exists here and holds a supported config.json and safetensors weights;
    else a ConfigError naming the model. For a Ray of our own: its replicas read the same paths."""
    for model in stack.models:
        if is_shape(model.model):  # a named shape: random weights, nothing to read
            continue
        try:
            path = resolve_model_dir(model.model)
            read_model_spec(path)
            weight_files(path)
        except (ModelLoadError, ConfigError) as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from None


def _replicas(deployment: dict[str, Any]) -> int:
    """How many replicas a deployment starts with."""
    auto = deployment.get("autoscaling_config")
    if auto is not None:
        initial = auto.get("initial_replicas")
        return int(initial if initial is not None else auto.get("min_replicas", 1))
    return int(deployment.get("num_replicas", 1))


def replica_ask(deployment: dict[str, Any]) -> Counter:
    """The Ray resources one replica of a deployment asks for (its placement group's bundles, or its actor's)."""
    bundles = deployment.get("placement_group_bundles")
    ask: Counter = Counter()
    if bundles:
        for bundle in bundles:
            ask.update({k: float(v) for k, v in bundle.items()})
        return ask
    actor = deployment.get("ray_actor_options") or {}
    ask["CPU"] = float(actor.get("num_cpus", 1))
    ask["GPU"] = float(actor.get("num_gpus", 0) or 0)
    ask.update({k: float(v) for k, v in (actor.get("resources") or {}).items()})
    return +ask  # drop zeros


def check_placement(config: dict[str, Any], cluster: dict[str, float]) -> None:
    """A ConfigError when the replicas the config starts with ask for more of a resource than the whole Ray
    cluster has (`cluster`: ray.cluster_resources()): they would wait for it forever on a Ray that cannot grow."""
    wanted: Counter = Counter()
    lines = []
    for app in config.get("applications", []):
        for deployment in app.get("deployments", []):
            count, ask = _replicas(deployment), replica_ask(deployment)
            if count and ask:
                for _ in range(count):
                    wanted.update(ask)
                lines.append(f"{deployment['name']}: {count} x {_show(ask)}")
    short = {k: v for k, v in wanted.items() if v > cluster.get(k, 0.0) + 1e-9}
    if short:
        have = _show({k: cluster.get(k, 0.0) for k in wanted})
        raise ConfigError(
            f"the replicas cannot be placed: they ask for {_show(wanted)} ({'; '.join(lines)}), the Ray cluster has "
            f"{have}. Lower num_replicas (or a pool's), or give Ray more (e.g. ray start --num-cpus N)")


def _show(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
