"""Ray's half of placement: Serve replicas onto the Ray nodes (worker pods) kube-scheduler placed.

A tensor-parallel replica's placement group is STRICT_PACK: all its bundles on one Ray node, i.e. in one
pod, hence on one Kubernetes node. A replica fits a Ray node with enough free GPUs and CPUs; Ray does not
know worker groups, so a replica may use any worker pod; the replica's own group is tried first, which is
what happens when the groups are sized for their deployments, as railyard renders them.
"""

from __future__ import annotations

from dataclasses import dataclass

from railyard.cluster.scheduler import Placement
from railyard.cluster.workload import Replica

CPU_MILLI = 1000


@dataclass
class RayNode:
    """A running Ray worker pod and what Ray can still place on it."""

    pod: str
    group: str
    node: str
    free_gpus: int
    free_cpus: int


@dataclass
class ReplicaPlacement:
    """Where one Serve replica runs, or why it waits."""

    replica: Replica
    pod: str | None
    node: str | None
    message: str = ""


def ray_nodes(placements: list[Placement]) -> list[RayNode]:
    """The worker pods that were scheduled; Ray counts whole CPUs from the pod's request."""
    return [
        RayNode(p.pod.name, p.pod.group, p.node, p.pod.gpus, p.pod.requests.get("cpu", 0) // CPU_MILLI)
        for p in placements
        if p.node is not None and p.pod.group != "head"
    ]


def _describe(replica: Replica) -> str:
    if replica.strict_pack:
        per = replica.cpus // replica.gpus if replica.gpus else replica.cpus
        return f"placement group STRICT_PACK {replica.gpus} x {{GPU: 1, CPU: {per}}}"
    return f"actor {{GPU: {replica.gpus}, CPU: {replica.cpus}}}"


def place_replicas(
    replicas: list[Replica], nodes: list[RayNode], head_running: bool, pending_groups: set[str] = frozenset()
) -> list[ReplicaPlacement]:
    """First fit of each replica onto a Ray node, own worker group first."""
    out = []
    for replica in replicas:
        if not head_running:
            out.append(ReplicaPlacement(replica, None, None, "Ray head pod is Pending: no Serve replica can start"))
            continue
        ordered = sorted(nodes, key=lambda n: n.group != replica.deployment)
        chosen = next((n for n in ordered if n.free_gpus >= replica.gpus and n.free_cpus >= replica.cpus), None)
        if chosen is None:
            largest = max((n.free_gpus for n in nodes), default=0)
            cpus = max((n.free_cpus for n in nodes if n.free_gpus >= replica.gpus), default=None)
            why = (
                f"worker pods of {replica.deployment} are Pending (see above); "
                if replica.deployment in pending_groups
                else ""
            )
            if cpus is not None:  # GPUs would fit somewhere; CPUs do not
                need = f"needs {replica.cpus} CPU(s) beside its GPUs, the most free is {cpus}"
            else:
                need = f"needs {replica.gpus} GPU(s) on one node, the most free on any running worker pod is {largest}"
            out.append(ReplicaPlacement(replica, None, None, f"{why}{_describe(replica)} fits no Ray node: {need}"))
            continue
        chosen.free_gpus -= replica.gpus
        chosen.free_cpus -= replica.cpus
        out.append(ReplicaPlacement(replica, chosen.pod, chosen.node))
    return out
