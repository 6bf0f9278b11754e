"""The cluster's GPU nodes and their labels: capacity the device plugin advertises, the GPU Feature Discovery
labels railyard's node affinity selects on, the GPU taint, and a MIG strategy consistent with what they show."""

from __future__ import annotations

from typing import Any

from railyard.cluster.doctor.kubectl import kubectl_items
from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, failed, passed, warned

GPU = "nvidia.com/gpu"


def is_gpu_node(node: dict[str, Any]) -> bool:
    """A node with NVIDIA hardware by GFD/NFD labels, or one that advertises GPUs."""
    labels = node.get("metadata", {}).get("labels", {}) or {}
    capacity = node.get("status", {}).get("capacity", {}) or {}
    return (
        labels.get("nvidia.com/gpu.present") == "true"
        or "nvidia.com/gpu.product" in labels
        or "nvidia.com/gpu.count" in labels
        or any(k == GPU or k.startswith("nvidia.com/mig-") for k in capacity)
    )


def _node_name(node: dict[str, Any]) -> str:
    return node.get("metadata", {}).get("name", "?")


def _gpu_nodes(probe: Probe) -> list[dict[str, Any]] | CheckResult:
    items = kubectl_items(probe, "nodes")
    if isinstance(items, CheckResult):
        return items
    return [n for n in items if is_gpu_node(n)]


def check_gpu_capacity(probe: Probe) -> CheckResult:
    name = "GPU capacity"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    if not nodes:
        return failed(
            name,
            "no GPU nodes found (no GFD labels, no nvidia.com/gpu capacity)",
            "add GPU nodes and deploy GPU Feature Discovery",
        )
    problems, degraded = [], []
    for node in nodes:
        status = node.get("status", {})
        cap, alloc = status.get("capacity", {}).get(GPU), status.get("allocatable", {}).get(GPU)
        mig = [k for k in status.get("capacity", {}) if k.startswith("nvidia.com/mig-")]
        if mig and not cap:
            continue  # mixed MIG strategy advertises mig-* resources instead; the MIG check covers it
        if not cap or int(cap) == 0:
            problems.append(f"{_node_name(node)} has no nvidia.com/gpu capacity")
        elif not alloc or int(alloc) == 0:
            problems.append(f"{_node_name(node)} has capacity {cap} but no allocatable nvidia.com/gpu")
        elif int(alloc) < int(cap):
            degraded.append(f"{_node_name(node)} allocatable {alloc} < capacity {cap}")
        label = node.get("metadata", {}).get("labels", {}).get("nvidia.com/gpu.count")
        if cap and label and int(label) != int(cap) and not mig:
            degraded.append(f"{_node_name(node)} reports {cap} nvidia.com/gpu but GFD counts {label} GPUs")
    if problems:
        return failed(
            name,
            "; ".join(problems),
            "the device plugin is not advertising GPUs on these nodes: check its pod there "
            "(`kubectl -n <ns> get pods -o wide | grep device-plugin`) and its log for NVML errors",
        )
    if degraded:
        return warned(
            name,
            "; ".join(degraded),
            "the device plugin marked GPUs unhealthy (XID errors) or a GPU fell off the bus: check `nvidia-smi -q` "
            "and `dmesg` on the node, drain and reset it",
        )
    total = sum(int(n["status"]["allocatable"].get(GPU, 0)) for n in nodes)
    return passed(name, f"{len(nodes)} GPU node(s), {total} allocatable nvidia.com/gpu")


def check_gfd_labels(probe: Probe) -> CheckResult:
    name = "GPU Feature Discovery labels"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    wanted = ("nvidia.com/gpu.product", "nvidia.com/gpu.count")
    unlabelled = [
        _node_name(n) for n in nodes if any(k not in (n.get("metadata", {}).get("labels") or {}) for k in wanted)
    ]
    if unlabelled:
        return failed(
            name,
            f"GPU nodes without {' / '.join(wanted)}: {', '.join(unlabelled)}; "
            "railyard's GPU node affinity selects on them, so its pods would stay Pending",
            "deploy GPU Feature Discovery (NVIDIA device plugin chart with `--set gfd.enabled=true`, or the "
            "GPU Operator), or render with policies.gpu_node_affinity: false",
        )
    products = sorted({n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes})
    return passed(name, f"all {len(nodes)} GPU node(s) labelled; products: {', '.join(products)}")


def _tolerable_gpu_taint(taint: dict[str, Any]) -> bool:
    return taint.get("key") == GPU and taint.get("effect") == "NoSchedule"


def check_gpu_taints(probe: Probe) -> CheckResult:
    name = "GPU node taints"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    untainted = [
        _node_name(n)
        for n in nodes
        if not any(_tolerable_gpu_taint(t) for t in n.get("spec", {}).get("taints", []) or [])
    ]
    if untainted:
        return warned(
            name,
            f"GPU nodes without the nvidia.com/gpu:NoSchedule taint: {', '.join(untainted)}",
            "CPU-only pods can fill these nodes and strand their GPUs: "
            + " && ".join(f"kubectl taint nodes {n} nvidia.com/gpu=present:NoSchedule" for n in untainted[:3]),
        )
    return passed(name, f"all {len(nodes)} GPU node(s) tainted nvidia.com/gpu:NoSchedule")


def check_mig(probe: Probe) -> CheckResult:
    name = "MIG strategy"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    strategies: dict[str, list[str]] = {}
    problems = []
    for node in nodes:
        labels = node.get("metadata", {}).get("labels", {}) or {}
        capacity = node.get("status", {}).get("capacity", {}) or {}
        strategy = labels.get("nvidia.com/mig.strategy", "none")
        strategies.setdefault(strategy, []).append(_node_name(node))
        mig = sorted(k for k in capacity if k.startswith("nvidia.com/mig-"))
        product = labels.get("nvidia.com/gpu.product", "")
        if strategy == "mixed" and not mig:
            problems.append(
                f"{_node_name(node)}: strategy mixed but no nvidia.com/mig-* resources (MIG disabled on its GPUs?)"
            )
        if strategy in ("none", "single") and mig:
            problems.append(f"{_node_name(node)}: strategy {strategy} but the node advertises {', '.join(mig)}")
        if strategy == "single" and "-MIG-" not in product:
            problems.append(
                f"{_node_name(node)}: strategy single but gpu.product {product!r} names no MIG profile (MIG disabled?)"
            )
        if strategy == "none" and "-MIG-" in product:
            problems.append(f"{_node_name(node)}: strategy none but gpu.product {product!r} is a MIG device")
    if problems:
        return failed(
            name,
            "; ".join(problems),
            "make the device plugin's and GFD's MIG_STRATEGY match how the GPUs are partitioned "
            "(`nvidia-smi -L`), e.g. helm `--set migStrategy=none` for whole GPUs, and re-apply the MIG config",
        )
    if len(strategies) > 1:
        detail = "; ".join(f"{s}: {', '.join(ns)}" for s, ns in sorted(strategies.items()))
        return warned(
            name,
            f"nodes disagree on the MIG strategy ({detail})",
            "one strategy per node pool is fine; make sure each model's gpu_product selects the pool it was sized for",
        )
    return passed(
        name, f"strategy {next(iter(strategies), 'none')} on all GPU nodes, consistent with what they advertise"
    )
