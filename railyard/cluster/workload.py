"""What the planner schedules: the pods the rendered manifests will create, read back from those manifests.

Planning from the rendered objects (not from the stack directly) means the planner checks exactly the
requests, tolerations and affinities `kubectl apply` would submit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from railyard.cluster.nodes import resource_amount

# Requests kube-scheduler assumes for scoring when a container sets none (schedutil.DefaultMilliCPURequest,
# DefaultMemoryRequest); fitting still uses the real (zero) request.
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY = 200 * 1024 * 1024


@dataclass(frozen=True)
class Term:
    """A pod (anti-)affinity term or spread constraint reduced to what the planner evaluates."""

    selector: frozenset[tuple[str, str]]
    topology_key: str
    weight: int = 0  # preferred terms only
    max_skew: int = 1  # spread constraints only


@dataclass
class PodSpec:
    """One pod to place, with the scheduling fields of its template."""

    name: str
    group: str
    labels: dict[str, str]
    requests: dict[str, int]
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    node_terms: list[list[dict[str, Any]]] | None = None  # required nodeSelectorTerms (ORed)
    anti_required: list[Term] = field(default_factory=list)
    anti_preferred: list[Term] = field(default_factory=list)
    spread_hard: list[Term] = field(default_factory=list)
    spread_soft: list[Term] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.requests.get("nvidia.com/gpu", 0)


@dataclass(frozen=True)
class Replica:
    """One Ray Serve replica: the GPUs and CPUs its placement group (or actor) needs on one Ray node."""

    deployment: str
    index: int
    gpus: int
    cpus: int
    strict_pack: bool


def _requests(containers: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        # Kubernetes defaults a missing request to the limit.
        for name in set(limits) | set(requests):
            value = requests.get(name, limits.get(name))
            total[name] = total.get(name, 0) + resource_amount(name, value)
    return total


def _term(raw: dict[str, Any], weight: int = 0) -> Term:
    selector = (raw.get("labelSelector") or {}).get("matchLabels") or {}
    return Term(frozenset(selector.items()), raw["topologyKey"], weight=weight, max_skew=int(raw.get("maxSkew", 1)))


def pod_from_template(name: str, group: str, template: dict[str, Any]) -> PodSpec:
    """The scheduling-relevant parts of a pod template."""
    spec = template.get("spec") or {}
    affinity = spec.get("affinity") or {}
    node_affinity = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    anti = affinity.get("podAntiAffinity") or {}
    spread = spec.get("topologySpreadConstraints") or []
    return PodSpec(
        name=name,
        group=group,
        labels=dict((template.get("metadata") or {}).get("labels") or {}),
        requests=_requests(spec.get("containers") or []),
        tolerations=list(spec.get("tolerations") or []),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_terms=[t.get("matchExpressions") or [] for t in node_affinity["nodeSelectorTerms"]]
        if node_affinity
        else None,
        anti_required=[_term(t) for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []],
        anti_preferred=[
            _term(t["podAffinityTerm"], t["weight"])
            for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ],
        spread_hard=[_term(c) for c in spread if c.get("whenUnsatisfiable") == "DoNotSchedule"],
        spread_soft=[_term(c) for c in spread if c.get("whenUnsatisfiable") == "ScheduleAnyway"],
    )


def pods_from_objects(objects: list[dict[str, Any]], at_max: bool = False) -> list[PodSpec]:
    """Every pod the objects create, in the order their controllers create them (head first)."""
    pods: list[PodSpec] = []
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            pods.append(pod_from_template(f"{name}-head", "head", cluster["headGroupSpec"]["template"]))
            for group in cluster.get("workerGroupSpecs", []):
                count = group.get("maxReplicas", 0) if at_max else group.get("replicas", 0)
                for i in range(count):
                    pods.append(
                        pod_from_template(
                            f"{name}-{group['groupName']}-worker-{i}", group["groupName"], group["template"]
                        )
                    )
        elif obj["kind"] in ("Deployment", "StatefulSet"):
            for i in range(obj["spec"].get("replicas", 1)):
                pods.append(pod_from_template(f"{name}-{i}", name, obj["spec"]["template"]))
    return pods


def replicas_from_objects(objects: list[dict[str, Any]], at_max: bool = False) -> list[Replica]:
    """The Ray Serve replicas a RayService's serveConfigV2 asks for (none for a plain Deployment)."""
    out: list[Replica] = []
    for obj in objects:
        if obj["kind"] != "RayService":
            continue
        config = yaml.safe_load(obj["spec"]["serveConfigV2"])
        for app in config.get("applications", []):
            for dep in app.get("deployments", []):
                auto = dep.get("autoscaling_config")
                count = (
                    (auto["max_replicas"] if at_max else auto["min_replicas"]) if auto else dep.get("num_replicas", 1)
                )
                bundles = dep.get("placement_group_bundles")
                if bundles:
                    gpus = int(sum(b.get("GPU", 0) for b in bundles))
                    cpus = int(sum(b.get("CPU", 0) for b in bundles))
                else:
                    actor = dep.get("ray_actor_options") or {}
                    # A fractional replica (gpu_fraction < 1) is planned as a whole GPU: pods hold whole GPUs.
                    gpus, cpus = math.ceil(actor.get("num_gpus", 0)), int(actor.get("num_cpus", 1))
                strict = dep.get("placement_group_strategy") == "STRICT_PACK"
                out += [Replica(dep["name"], i, gpus, cpus, strict) for i in range(count)]
    return out
