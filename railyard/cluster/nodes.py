"""The planner's view of a cluster: nodes with labels, taints and allocatable resources.

Read from `kubectl get nodes -o json` (a List of Nodes) or from a small inventory YAML a user writes:

    nodes:
      - name: a100            # with count: N, expands to a100-0 .. a100-(N-1)
        count: 4
        gpu: {product: NVIDIA-A100-SXM4-80GB, count: 8, memory_mib: 81920}   # GFD labels + capacity + taint
        allocatable: {cpu: "96", memory: 1000Gi, pods: 110}
        labels: {topology.kubernetes.io/zone: us-east-1a}
        taints: [{key: dedicated, value: llm, effect: NoSchedule}]
        used: {cpu: "4", nvidia.com/gpu: 2}     # requests of pods already running there
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from railyard.cluster.quantity import milli, units
from railyard.errors import ConfigError

GPU = "nvidia.com/gpu"
HOSTNAME = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass
class Node:
    """One node: allocatable in scheduler units (cpu millicores, memory bytes, others whole units)."""

    name: str
    labels: dict[str, str]
    allocatable: dict[str, int]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    requested: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


def resource_amount(name: str, value: Any) -> int:
    """A quantity in the unit kube-scheduler compares: millicores for cpu, whole units otherwise."""
    return milli(value) if name == "cpu" else units(value)


def _resources(raw: dict[str, Any] | None) -> dict[str, int]:
    return {k: resource_amount(k, v) for k, v in (raw or {}).items()}


def _taints(raw: list[dict[str, Any]] | None) -> tuple[Taint, ...]:
    return tuple(Taint(t["key"], str(t.get("value", "") or ""), t["effect"]) for t in raw or [])


def _from_k8s(item: dict[str, Any]) -> Node:
    meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
    labels = dict(meta.get("labels") or {})
    labels.setdefault(HOSTNAME, meta["name"])
    return Node(
        name=meta["name"],
        labels=labels,
        allocatable=_resources(status.get("allocatable")),
        taints=_taints(spec.get("taints")),
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def _from_inventory(entry: dict[str, Any]) -> list[Node]:
    if "name" not in entry:
        raise ConfigError(f"inventory node {entry!r} has no name")
    labels = {k: str(v) for k, v in (entry.get("labels") or {}).items()}
    allocatable = dict(entry.get("allocatable") or {})
    taints = list(entry.get("taints") or [])
    gpu = entry.get("gpu")
    if gpu:
        count = int(gpu.get("count", 1))
        labels.setdefault("nvidia.com/gpu.present", "true")
        labels.setdefault("nvidia.com/gpu.count", str(count))
        if gpu.get("product"):
            labels.setdefault("nvidia.com/gpu.product", str(gpu["product"]))
        if gpu.get("memory_mib"):
            labels.setdefault("nvidia.com/gpu.memory", str(gpu["memory_mib"]))
        labels.setdefault("nvidia.com/mig.strategy", "none")
        allocatable.setdefault(GPU, count)
        if gpu.get("tainted", True):
            taints.append({"key": GPU, "value": "present", "effect": "NoSchedule"})
    allocatable.setdefault("pods", 110)
    count = int(entry.get("count", 1))
    names = [entry["name"]] if count == 1 else [f"{entry['name']}-{i}" for i in range(count)]
    nodes = []
    for name in names:
        node_labels = dict(labels)
        node_labels.setdefault(HOSTNAME, name)
        nodes.append(
            Node(
                name=name,
                labels=node_labels,
                allocatable=_resources(allocatable),
                taints=_taints(taints),
                unschedulable=bool(entry.get("unschedulable", False)),
                requested=_resources(entry.get("used")),
            )
        )
    return nodes


def parse_nodes(data: Any, source: str = "nodes") -> list[Node]:
    """Nodes from parsed `kubectl get nodes -o json` output or an inventory mapping."""
    if isinstance(data, dict) and data.get("kind") in ("List", "NodeList"):
        try:
            return [_from_k8s(item) for item in data.get("items", []) if item.get("kind", "Node") == "Node"]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{source}: malformed Node ({type(exc).__name__}: {exc})") from None
    if isinstance(data, dict) and data.get("kind") == "Node":
        return [_from_k8s(data)]
    if isinstance(data, dict) and isinstance(data.get("nodes"), list):
        nodes = []
        for i, entry in enumerate(data["nodes"]):
            try:
                nodes += _from_inventory(entry)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"{source}: nodes[{i}]: malformed entry ({type(exc).__name__}: {exc})") from None
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ConfigError(f"{source}: node names must be unique")
        return nodes
    raise ConfigError(f"{source}: expected `kubectl get nodes -o json` output or an inventory with a 'nodes' list")


def pod_requests(spec: dict[str, Any]) -> dict[str, int]:
    """A pod's effective requests as the scheduler counts them: max(sum of containers, largest init
    container) per resource, plus the pod overhead; a missing request defaults to the limit."""

    def one(container: dict[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        return {k: resource_amount(k, requests.get(k, limits.get(k))) for k in set(limits) | set(requests)}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for k, v in one(container).items():
            total[k] = total.get(k, 0) + v
    for container in spec.get("initContainers") or []:
        for k, v in one(container).items():
            total[k] = max(total.get(k, 0), v)
    for k, v in (spec.get("overhead") or {}).items():
        total[k] = total.get(k, 0) + resource_amount(k, v)
    return total


def apply_running_pods(nodes: list[Node], data: Any, source: str = "pods") -> int:
    """Charge the pods of `kubectl get pods -A -o json` to their nodes; returns how many were counted.

    Finished pods (Succeeded, Failed) hold nothing; pods not bound to a listed node are skipped.
    """
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ConfigError(f"{source}: expected `kubectl get pods --all-namespaces -o json` output")
    by_name = {n.name: n for n in nodes}
    counted = 0
    for item in data["items"]:
        spec, status = item.get("spec") or {}, item.get("status") or {}
        node = by_name.get(spec.get("nodeName", ""))
        if node is None or status.get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            requests = pod_requests(spec)
        except ConfigError as exc:
            raise ConfigError(f"{source}: pod {item.get('metadata', {}).get('name', '?')}: {exc}") from None
        for k, v in requests.items():
            node.requested[k] = node.requested.get(k, 0) + v
        node.pods += 1
        counted += 1
    return counted


def _read(path: str | Path, what: str) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path} not found") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not valid JSON/YAML: {exc}") from None


def load_pods_into(nodes: list[Node], path: str | Path) -> int:
    """Charge the running pods recorded in a file to the nodes."""
    return apply_running_pods(nodes, _read(path, "pods"), str(path))


def load_nodes(path: str | Path) -> list[Node]:
    """Nodes from a JSON or YAML file (JSON is YAML, so one parser reads both)."""
    return parse_nodes(_read(path, "nodes"), str(path))
