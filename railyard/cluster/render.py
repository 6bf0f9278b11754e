"""Render a stack to Kubernetes objects: a KubeRay RayService, or a Deployment + Service for one engine.

Objects are plain dicts in the order `kubectl apply` wants them; `to_yaml` writes the multi-document file.
The RayService's serveConfigV2 is `to_serve_config(stack)` dumped as YAML: the same config layer 2 runs.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import yaml

from railyard.cluster import pod
from railyard.errors import ConfigError
from railyard.stack import (
    Autoscaling, Ingress, Lifecycle, Stack, StackModel, engine_options, replica_pools, scaling, to_serve_config)

MODES = ("rayservice", "deployment")


def _meta(stack: Stack, name: str, component: str, model: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": stack.namespace, "labels": pod.labels(stack, component, model)}


def _pdb(stack: Stack, component: str, model: str | None) -> dict[str, Any]:
    # maxUnavailable 1 (not minAvailable) so a one-replica group still lets a node drain.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(stack, f"{stack.name}-{component}", component, model),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod.selector(stack, component)}},
    }


def _worker_group(stack: Stack, model: StackModel, group: str, pool) -> dict[str, Any]:
    replicas, auto = scaling(model, pool)
    low, high = (auto.min_replicas, auto.max_replicas) if auto else (replicas, replicas)
    return {
        "groupName": group,
        "replicas": low,
        "minReplicas": low,
        "maxReplicas": high,
        "rayStartParams": {"metrics-export-port": str(pod.RAY_METRICS_PORT)},
        "template": pod.ray_worker_pod(stack, model, group),
    }


def ray_service(stack: Stack) -> dict[str, Any]:
    """The KubeRay RayService: a CPU head plus one worker group per engine deployment."""
    groups = [_worker_group(stack, model, group, p) for model in stack.models for group, p in replica_pools(model)]
    autoscaled = any(g["minReplicas"] != g["maxReplicas"] for g in groups)
    cluster: dict[str, Any] = {
        "rayVersion": stack.ray_version,
        "enableInTreeAutoscaling": autoscaled,
        "headGroupSpec": {
            # num-gpus 0: Serve must never place an engine replica on the head.
            "rayStartParams": {
                "dashboard-host": "0.0.0.0",
                "num-gpus": "0",
                "metrics-export-port": str(pod.RAY_METRICS_PORT),
            },
            "template": pod.ray_head_pod(stack),
        },
        "workerGroupSpecs": groups,
    }
    serve_yaml = annotated_serve_yaml(to_serve_config(stack))
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _meta(stack, stack.name, "rayservice"),
        "spec": {"serveConfigV2": serve_yaml, "rayClusterConfig": cluster},
    }


def option_reasons() -> dict[str, str]:
    """Why each autoscaling and lifecycle option of an engine deployment is set: the stack fields' descriptions,
    under the names Ray Serve gives them."""
    reasons = {name: field.description for cls in (Autoscaling, Lifecycle)
               for name, field in cls.model_fields.items() if field.description}
    reasons["target_ongoing_requests"] = reasons.pop("target_pending_per_replica")
    reasons["max_ongoing_requests"] = ("Ray's default of 5 would starve continuous batching: a replica admits as "
                                       "many requests as its engine can batch (max_num_seqs)")
    return reasons


def arg_reasons() -> dict[str, str]:
    """Why the streaming, ingress and standby settings of the app's args are set: the stack fields' descriptions."""
    fields = StackModel.model_fields
    return {"stream_interval_s": fields["stream_interval_s"].description,
            "stream_items_per_s": fields["stream_items_per_s"].description,
            "ingress": Ingress.model_fields["num_replicas"].description,
            "standby": Autoscaling.model_fields["standby_engines"].description}


def annotated_serve_yaml(config: dict[str, Any]) -> str:
    """The Ray Serve config as YAML, the streaming settings of the app's args (arg_reasons()) and each deployment
    option of option_reasons() under a comment giving its reason where it first appears (comments only: the YAML
    loads to `config` unchanged)."""
    reasons = arg_reasons()
    lines, in_deployments, given = [], False, set()
    for line in yaml.safe_dump(config, sort_keys=False).splitlines():
        if not in_deployments and re.match(r"^\s*deployments:", line):
            in_deployments, reasons = True, option_reasons()
            lines.append(re.sub(r"\S.*", "# Each option's reason is given where it first appears.", line))
        match = re.match(r"^(\s*)(- )?(\w+):", line)
        if match and match.group(3) in reasons and match.group(3) not in given:
            given.add(match.group(3))
            indent = match.group(1) + ("  " if match.group(2) else "")
            lines += textwrap.wrap(reasons[match.group(3)], 110, initial_indent=f"{indent}# ",
                                   subsequent_indent=f"{indent}# ")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _single_engine(stack: Stack) -> StackModel:
    model = stack.models[0]
    if len(stack.models) != 1 or model.pools or model.autoscaling:
        raise ConfigError(
            "deployment mode runs one engine: exactly one model, no pools, no autoscaling; "
            "use mode rayservice for several models, pools or autoscaling"
        )
    return model


def deployment(stack: Stack) -> list[dict[str, Any]]:
    """A Deployment and its Service for a single engine (`railyard serve`), no Ray."""
    model = _single_engine(stack)
    component = "engine"
    template = pod.engine_pod(stack, model, component, engine_options(model))
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(stack, f"{stack.name}-{model.name}", component, model.name),
        "spec": {
            "replicas": model.num_replicas,
            "selector": {"matchLabels": pod.selector(stack, component)},
            # maxSurge 0: a rollout never needs a spare GPU, it replaces one replica at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(stack, f"{stack.name}-{model.name}", component, model.name),
        "spec": {
            "type": "ClusterIP",
            "selector": pod.selector(stack, component),
            "ports": [{"name": "http", "port": pod.HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [dep, svc]


def _vpa(stack: Stack, target: dict[str, Any]) -> dict[str, Any]:
    # updateMode Initial: requests are set when a pod starts, never by evicting a running GPU replica.
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": _meta(stack, target["metadata"]["name"], "engine"),
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target["metadata"]["name"]},
            "updatePolicy": {"updateMode": "Initial"},
            "resourcePolicy": {
                "containerPolicies": [
                    {
                        "containerName": "*",
                        "controlledResources": ["cpu", "memory"],
                        "controlledValues": "RequestsAndLimits",
                    }
                ]
            },
        },
    }


def render(stack: Stack, mode: str | None = None) -> list[dict[str, Any]]:
    """All objects for a stack in the given mode (default: the stack's own)."""
    mode = mode or stack.mode
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    policies = stack.policies
    if mode == "deployment":
        objects = deployment(stack)
        if policies.pdb:
            objects.append(_pdb(stack, "engine", stack.models[0].name))
        if policies.vpa:
            objects.append(_vpa(stack, objects[0]))
        return objects
    if policies.vpa:
        raise ConfigError(
            "policies.vpa needs mode deployment: KubeRay generates the RayCluster's name, so a VPA cannot target it"
        )
    objects = [ray_service(stack)]
    if policies.pdb:
        for model in stack.models:
            for group, _ in replica_pools(model):
                objects.append(_pdb(stack, group, model.name))
    return objects


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (serveConfigV2) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML for `kubectl apply -f`."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
