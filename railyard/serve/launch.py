"""Start a stack's Ray Serve application on a local Ray (or join a cluster with an address).

The stack renders to a standard Ray Serve config (`railyard.stack.to_serve_config`); this module
deploys that config the way `serve run config.yaml` does (the controller builds the app from
`import_path` + `args` and applies each `deployments` entry by name), after two adjustments:
- a config-file `autoscaling_config` replaces the one set in code, so ours gets the pending-requests
  policy back wherever the file names none;
- on a machine without GPUs (or with `cpu=True`) replicas ask for no GPU and engines run on the CPU.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any

from railyard.errors import ConfigError
from railyard.serve.autoscaling import POLICIES, POLICY_IMPORT_PATH
from railyard.serve.preflight import check_placement

log = logging.getLogger("railyard.serve")


def with_pending_policy(config: dict[str, Any]) -> dict[str, Any]:
    """Every autoscaling deployment without a policy gets railyard's pending-requests policy."""
    config = copy.deepcopy(config)
    for app in config.get("applications", []):
        for dep in app.get("deployments", []):
            auto = dep.get("autoscaling_config")
            if auto is not None and "policy" not in auto:
                auto["policy"] = {"policy_function": POLICY_IMPORT_PATH}
    return config


def with_autoscaling_policy(config: dict[str, Any], policy: str) -> dict[str, Any]:
    """Every autoscaling deployment scaled by `policy` (a name in railyard.serve.autoscaling.POLICIES)."""
    if policy not in POLICIES:
        raise ConfigError(f"autoscaling policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    config = copy.deepcopy(config)
    for app in config.get("applications", []):
        for dep in app.get("deployments", []):
            if dep.get("autoscaling_config") is not None:
                dep["autoscaling_config"]["policy"] = {"policy_function": POLICIES[policy]}
    return config


def for_cpu(config: dict[str, Any]) -> dict[str, Any]:
    """The same applications with engines on the CPU: no GPU per replica or bundle, float32 weights."""
    config = copy.deepcopy(config)
    for app in config.get("applications", []):
        for model in (app.get("args") or {}).get("models", []):
            for engine in [model.get("engine") or {}] + [p.get("engine") or {} for p in model.get("pools", [])]:
                engine["device"] = "cpu"
                engine["dtype"] = "float32"  # bfloat16 matmuls on a CPU are slow and imprecise
        for dep in app.get("deployments", []):
            actor = dep.setdefault("ray_actor_options", {})
            actor["num_gpus"] = 0
            for bundle in dep.get("placement_group_bundles") or []:
                bundle.pop("GPU", None)
                bundle.setdefault("CPU", 1)
    return config


def with_router(config: dict[str, Any], router: str) -> dict[str, Any]:
    """Every railyard application routed by `router` (one of railyard.serve.spec.ROUTER_NAMES)."""
    config = copy.deepcopy(config)
    for app in config.get("applications", []):
        if app.get("import_path") == "railyard.serve.app:build_app":
            app.setdefault("args", {})["router"] = {**app["args"].get("router", {}), "name": router}
    return config


def deploy(config: dict[str, Any], *, address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
           cpu: bool | None = None, router: str | None = None, autoscaling_policy: str | None = None,
           timeout_s: float = 600.0, progress: Callable[[str], None] | None = None, own_ray: bool = False) -> str:
    """Connect to (or start) Ray, start Serve's HTTP proxy, deploy `config`; returns the base URL once running.

    own_ray: a Ray started for this stack alone, which cannot grow: replicas asking for more than it has are refused
    before anything deploys (preflight.check_placement) and pending ones fail the deploy."""
    import ray
    from ray.serve._private import api as serve_private
    from ray.serve.schema import ServeDeploySchema

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    if cpu is None:
        cpu = ray.cluster_resources().get("GPU", 0) == 0
    config = with_pending_policy(config)
    if autoscaling_policy:
        config = with_autoscaling_policy(config, autoscaling_policy)
    if router:
        config = with_router(config, router)
    if cpu:
        log.info("no GPUs in this Ray cluster: engines run on the CPU")
        config = for_cpu(config)
    if own_ray:
        check_placement(config, ray.cluster_resources())
    try:
        schema = ServeDeploySchema.model_validate(config)
    except ValueError as exc:  # pydantic's ValidationError
        raise ConfigError(f"not a valid Ray Serve config: {exc}") from None
    # What `serve run config.yaml` does: the controller builds each app and applies the deployments.
    client = serve_private.serve_start(http_options={"host": host, "port": port})
    client.deploy_apps(schema, _blocking=False)
    names = [app["name"] for app in config["applications"]]
    wait_running(names, timeout_s, progress, unschedulable_fails=own_ray)
    return f"http://{host}:{port}"


ERROR_TAIL_LINES = 8  # of a failed deployment's message (a replica's traceback ends with what went wrong)


def _state(status) -> str:
    return str(getattr(status, "value", status))


def describe_progress(apps: dict, app_names: list[str]) -> str:
    """One line: each deployment's replicas by state, e.g. `engine-tiny-default 1 STARTING, openai-ingress 1
    RUNNING`."""
    parts = []
    for name in app_names:
        app = apps.get(name)
        if app is None:
            parts.append(f"{name}: not deployed yet")
            continue
        for dep, status in sorted(app.deployments.items()):
            states = ", ".join(f"{n} {_state(s)}" for s, n in sorted(status.replica_states.items(), key=str) if n)
            parts.append(f"{dep} {states or _state(status.status)}")
    return "; ".join(parts)


def deploy_failure(apps: dict, app_names: list[str], *, unschedulable_fails: bool) -> str | None:
    """Why the deploy cannot succeed, from Serve's own status: a deployment that failed (the last lines of its
    message: a replica's error) or, on a Ray that cannot grow (unschedulable_fails), replicas Ray cannot place
    (the resources they ask for and the cluster has); None while it may still come up."""
    reasons = []
    for name in app_names:
        app = apps.get(name)
        if app is None:
            continue
        for dep, status in sorted(app.deployments.items()):
            state, message = _state(status.status), (status.message or "").strip()
            if state in ("DEPLOY_FAILED", "UNHEALTHY") and message:
                reasons.append(f"{dep} failed:\n  " + "\n  ".join(message.splitlines()[-ERROR_TAIL_LINES:]))
            elif unschedulable_fails and "to be scheduled" in message:
                reasons.append(f"{dep}: {message}")
        if not reasons and _state(app.status) == "DEPLOY_FAILED":
            reasons.append(f"{name}: {app.message}")
    return "\n".join(reasons) or None


def wait_running(app_names: list[str], timeout_s: float, progress: Callable[[str], None] | None = None,
                 unschedulable_fails: bool = False) -> None:
    """Block until every app is RUNNING, telling `progress` each change of the replicas' states; a deploy that
    cannot succeed raises ConfigError with the reason (deploy_failure)."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        apps = serve.status().applications
        line = describe_progress(apps, app_names)
        if progress is not None and line and line != last:
            progress(line)
            last = line
        failure = deploy_failure(apps, app_names, unschedulable_fails=unschedulable_fails)
        if failure:
            raise ConfigError("deploy failed: " + failure)
        states = {n: _state(apps[n].status) for n in app_names if n in apps}
        if len(states) == len(app_names) and all(s == "RUNNING" for s in states.values()):
            return
        if time.monotonic() > deadline:
            raise ConfigError(f"applications not running after {timeout_s:.0f}s: {line}")
        time.sleep(0.5)
