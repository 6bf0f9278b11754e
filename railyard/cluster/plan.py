"""`railyard plan`: will the stack run on these nodes, where, and how big is each replica?

Renders the stack, expands the manifests into pods, simulates kube-scheduler over the nodes, places the
Serve replicas on the resulting Ray nodes, and sizes each replica's KV cache (plus, given a measured
engine profile and a target rate, the replicas needed).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from railyard.cluster.nodes import GPU, Node, load_nodes, load_pods_into
from railyard.cluster.placement import ReplicaPlacement, place_replicas, ray_nodes
from railyard.cluster.quantity import parse_quantity
from railyard.cluster.render import render
from railyard.cluster.scheduler import AFFINITY, ANTI_AFFINITY, KubeScheduler, Placement
from railyard.cluster.sizing import (
    GPU_MEMORY_MIB,
    SHAPES,
    MIB,
    EngineProfile,
    KVSizing,
    engine_accepts,
    load_profile,
    replicas_for_rate,
    resolve_shape,
    size_kv_cache,
)
from railyard.cluster.workload import PodSpec, pods_from_objects, replicas_from_objects
from railyard.errors import ConfigError, RailyardError
from railyard.model.kv_fit import kv_shortfall
from railyard.model.spec import ModelSpec
from railyard.stack import (
    BATCHED_TOKENS_FLOOR, Autoscaling, Stack, StackModel, load_stack, replica_pools, resolved_engine, scaling,
    standby_engines)

PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"


@dataclass
class DeploymentSizing:
    """KV-cache capacity of one deployment's replica, and the replicas a target rate needs."""

    deployment: str
    model: str
    gpu_product: str | None
    kv: KVSizing | None
    note: str = ""
    configured_replicas: int = 0
    needed_replicas: int | None = None
    standby_host_bytes: int = 0  # host memory the standby engines asleep beside one GPU's replicas keep (weights)


@dataclass
class PlanResult:
    """Everything `railyard plan` found."""

    pods: list[Placement]
    hints: dict[str, str]
    replicas: list[ReplicaPlacement]
    sizing: list[DeploymentSizing] = field(default_factory=list)
    profile: EngineProfile | None = None
    target_rps: float | None = None

    @property
    def all_placed(self) -> bool:
        return all(p.node for p in self.pods) and all(r.node for r in self.replicas)

    def as_dict(self) -> dict[str, Any]:
        return {
            "all_placed": self.all_placed,
            "pods": [
                {
                    "pod": p.pod.name,
                    "group": p.pod.group,
                    "node": p.node,
                    "message": p.message or None,
                    "hint": self.hints.get(p.pod.name),
                }
                for p in self.pods
            ],
            "replicas": [
                {
                    "deployment": r.replica.deployment,
                    "index": r.replica.index,
                    "gpus": r.replica.gpus,
                    "pod": r.pod,
                    "node": r.node,
                    "message": r.message or None,
                }
                for r in self.replicas
            ],
            "sizing": [
                {
                    "deployment": s.deployment,
                    "model": s.model,
                    "gpu_product": s.gpu_product,
                    "kv_cache": s.kv.as_dict() if s.kv else None,
                    "note": s.note or None,
                    "configured_replicas": s.configured_replicas,
                    "needed_replicas": s.needed_replicas,
                }
                for s in self.sizing
            ],
            "target_rps": self.target_rps,
            "profile": {"requests_per_s": self.profile.requests_per_s, "source": self.profile.source}
            if self.profile
            else None,
        }


def _required_products(pod: PodSpec) -> list[str]:
    for term in pod.node_terms or []:
        for expr in term:
            if expr["key"] == PRODUCT and expr["operator"] == "In":
                return list(expr["values"])
    return []


def hint(pod: PodSpec, reasons: dict[str, int], nodes: list[Node]) -> str:
    """What to change so a Pending pod fits, from the reasons kube-scheduler gave."""
    if not reasons:
        return "no nodes in the inventory"
    top = max(reasons, key=reasons.get)
    if top == f"Insufficient {GPU}":
        largest = max((n.allocatable.get(GPU, 0) for n in nodes), default=0)
        if pod.gpus > largest:
            return (
                f"a replica needs {pod.gpus} GPUs in one pod (tensor parallel, STRICT_PACK keeps them on one node) "
                f"but the largest node has {largest} allocatable {GPU}: lower tensor_parallel_size or add "
                f"{pod.gpus}-GPU nodes"
            )
        return (
            f"every node that could take it has fewer than {pod.gpus} free {GPU}: add GPU nodes or lower num_replicas"
        )
    if top.startswith("node(s) had untolerated taint") and pod.group == "head":
        return "the Ray head runs on CPU and tolerates no GPU taint: add an untainted CPU node (pool)"
    if top.startswith("node(s) had untolerated taint"):
        return "the pod does not tolerate the node taint: keep policies.gpu_toleration on (or tolerate that taint)"
    if top == AFFINITY:
        wanted = _required_products(pod)
        present = sorted({n.labels[PRODUCT] for n in nodes if PRODUCT in n.labels})
        if wanted and not set(wanted) & set(present):
            return f"no node has {PRODUCT} in {wanted}; products here: {present or 'none (is GFD running?)'}"
        counts = [
            int(n.labels[GPU_COUNT]) for n in nodes
            if n.labels.get(GPU_COUNT, "").isdigit() and (not wanted or n.labels.get(PRODUCT) in wanted)
        ]
        if pod.gpus and counts and max(counts) < pod.gpus:
            return (
                f"a replica needs {pod.gpus} GPUs on one node (tensor_parallel_size); the largest matching node "
                f"has {max(counts)} ({GPU_COUNT}): lower tensor_parallel_size or add bigger nodes"
            )
        return "no node has the labels the pod requires (GFD gpu.product, gpu.count >= tensor_parallel_size)"
    if top == ANTI_AFFINITY:
        return "spread: required allows one replica per node: add nodes or use spread: preferred"
    if top.startswith("Insufficient "):
        resource = top.removeprefix("Insufficient ")
        return f"not enough free {resource} on any fitting node: lower the model's resources.{resource} or add nodes"
    return top


def _gpu_memory(stack: Stack, product: str | None, nodes: list[Node]) -> tuple[int | None, str]:
    labelled = [
        int(n.labels["nvidia.com/gpu.memory"])
        for n in nodes
        if "nvidia.com/gpu.memory" in n.labels and (product is None or n.labels.get(PRODUCT) == product)
    ]
    if labelled:
        return min(labelled) * MIB, "nvidia.com/gpu.memory label"
    if product and product in GPU_MEMORY_MIB:
        return GPU_MEMORY_MIB[product] * MIB, f"known memory of {product}"
    return None, ""


def size_deployments(
    stack: Stack, nodes: list[Node], profile: EngineProfile | None, target_rps: float | None
) -> list[DeploymentSizing]:
    """KV-cache sizing (and replicas for the target rate) of every deployment in the stack.

    A model its engine would refuse (its config.json, tensor_parallel_size, max_model_len, dtype) is a
    ConfigError carrying the engine's own message."""
    out = []
    for model in stack.models:
        try:
            out += _size_model(stack, model, nodes, profile, target_rps)
        except RailyardError as exc:
            raise ConfigError(f"model {model.name!r}: {exc}") from None
    return out


def engine_limits(engine: dict[str, Any], spec: ModelSpec) -> dict[str, int]:
    """max_model_len and max_num_batched_tokens as the engine resolves them for this model where the stack leaves
    them unset (EngineConfig.resolve): the model's max_position_embeddings, and max(BATCHED_TOKENS_FLOOR,
    max_num_seqs)."""
    return {"max_model_len": engine["max_model_len"] or spec.max_position_embeddings,
            "max_num_batched_tokens": engine["max_num_batched_tokens"]
            or max(BATCHED_TOKENS_FLOOR, engine["max_num_seqs"])}


def _lora_slots(engine: dict[str, Any]) -> dict[str, int]:
    """The LoRA adapter slots an engine with these resolved options allocates (none unless enable_lora)."""
    if not engine.get("enable_lora"):
        return {}
    return {key: engine[key] for key in ("max_loras", "max_lora_rank")}


def _size_model(stack: Stack, model: StackModel, nodes: list[Node], profile: EngineProfile | None,
                target_rps: float | None) -> list[DeploymentSizing]:
    out = []
    product = model.gpu_product or stack.gpu_product
    found = resolve_shape(model.name, model.model, model.shape)
    memory, _ = _gpu_memory(stack, product, nodes)
    for name, pool in replica_pools(model):
        engine = resolved_engine(model, pool)
        precision = dict(dtype=engine["dtype"], kv_cache_dtype=engine["kv_cache_dtype"],
                         quantization=engine["quantization"])
        replicas, auto = scaling(model, pool)
        entry = DeploymentSizing(
            name, model.name, product, None, configured_replicas=auto.max_replicas if auto else replicas
        )
        if found is None:
            known = ", ".join(sorted(SHAPES))
            entry.note = f"no shape for {model.name}: set `shape:` ({known}) or mount the checkpoint"
        else:
            engine.update(engine_limits(engine, found[0]))
            engine_accepts(found[0], tensor_parallel_size=model.tensor_parallel_size,
                           max_model_len=engine["max_model_len"], **precision)
        if found is not None and memory is None:
            entry.note = "GPU memory unknown: no nvidia.com/gpu.memory label and no known gpu_product"
        elif found is not None:
            entry.kv = size_kv_cache(
                found[0],
                gpu_memory_bytes=memory,
                tensor_parallel_size=model.tensor_parallel_size,
                gpu_memory_utilization=engine["gpu_memory_utilization"],
                block_size=engine["block_size"],
                max_model_len=engine["max_model_len"],
                **precision,
                max_num_seqs=engine["max_num_seqs"],
                max_num_batched_tokens=engine["max_num_batched_tokens"],
                enforce_eager=engine["enforce_eager"],
                piecewise_cuda_graphs=engine["piecewise_cuda_graphs"],
                **_lora_slots(engine),
            )
            entry.note = f"shape from {found[1]}"
            if entry.kv.num_blocks == 0:
                entry.note += "; the weights leave no room for KV cache: raise tensor_parallel_size"
            elif (short := kv_shortfall(entry.kv.num_blocks, engine["block_size"], engine["max_model_len"],
                                        engine["max_num_batched_tokens"], found[0].kv_sliding_window)) is not None:
                fits = f"max_model_len {short.fits} fits, or " if short.fits else ""
                entry.note += (f"; the engine would refuse to start: {short.describe()}: {fits}give the cache "
                               "more memory (gpu_memory_utilization, a smaller max_num_batched_tokens, "
                               "tensor_parallel_size)")
            _note_standby(entry, model, auto)
        if profile is not None and target_rps is not None:
            mismatch = profile.mismatch(found[0], product) if found is not None else None
            if mismatch:
                raise ConfigError(f"--profile {profile.source} was measured on {mismatch}: its requests/s do not size "
                                  f"{model.name}'s replicas; measure them with `railyard bench throughput` on that "
                                  "model and GPU")
            entry.needed_replicas = replicas_for_rate(target_rps, profile)
        out.append(entry)
    return out


def plan(
    stack: Stack,
    nodes: list[Node],
    *,
    mode: str | None = None,
    profile: EngineProfile | None = None,
    target_rps: float | None = None,
    at_max: bool = False,
) -> PlanResult:
    """Place every pod and replica of the stack on the nodes, and size the replicas."""
    objects = render(stack, mode)
    pods = pods_from_objects(objects, at_max=at_max)
    nodes = copy.deepcopy(nodes)  # the scheduler binds into its nodes; the caller's stay as they were
    placements = KubeScheduler(nodes).schedule_all(pods)
    hints = {p.pod.name: hint(p.pod, p.reasons or {}, nodes) for p in placements if p.node is None}
    head_running = all(p.node for p in placements if p.pod.group == "head")
    pending = {p.pod.group for p in placements if p.node is None}
    replicas = place_replicas(
        replicas_from_objects(objects, at_max=at_max), ray_nodes(placements), head_running, pending
    )
    return PlanResult(
        placements, hints, replicas, size_deployments(stack, nodes, profile, target_rps), profile, target_rps
    )


def plan_from_files(
    config: str | Path,
    nodes_path: str | Path,
    *,
    mode: str | None = None,
    bench: str | Path | None = None,
    target_rps: float | None = None,
    at_max: bool = False,
    pods_path: str | Path | None = None,
) -> PlanResult:
    """`railyard plan`'s entry: read the stack, the nodes, their running pods and a bench profile."""
    profile = load_profile(bench) if bench else None
    nodes = load_nodes(nodes_path)
    if pods_path:
        load_pods_into(nodes, pods_path)
    return plan(
        load_stack(config), nodes, mode=mode, profile=profile, target_rps=target_rps, at_max=at_max
    )


def _note_standby(entry: DeploymentSizing, model: StackModel, auto: Autoscaling | None) -> None:
    """What the deployment's standby engines keep in host memory (their weights, asleep), and whether the pod's
    memory holds it."""
    engines = standby_engines(auto, model.gpu_fraction)
    if not engines or entry.kv is None:
        return
    entry.standby_host_bytes = engines * entry.kv.weights_bytes
    entry.note += (f"; {engines} standby engine(s) asleep per GPU keep {_gib(entry.standby_host_bytes)} of weights "
                   "in host memory")
    if entry.standby_host_bytes >= parse_quantity(model.resources.memory):
        entry.note += (f", more than the pod's memory ({model.resources.memory}): raise resources.memory or set "
                       "autoscaling.standby_engines: 0")


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def format_plan(result: PlanResult) -> str:
    """A human-readable report: pods, replicas, KV-cache sizing, replicas for the target rate."""
    lines = ["Pods (kube-scheduler):"]
    width = max((len(p.pod.name) for p in result.pods), default=10)
    for p in result.pods:
        if p.node:
            lines.append(f"  {p.pod.name:<{width}}  -> {p.node}")
        else:
            lines.append(f"  {p.pod.name:<{width}}  Pending: {p.message}")
            lines.append(f"  {'':<{width}}    hint: {result.hints[p.pod.name]}")
    if result.replicas:
        lines.append("Serve replicas (Ray):")
        for r in result.replicas:
            label = f"{r.replica.deployment}#{r.replica.index}"
            where = f"-> {r.pod} on {r.node}" if r.node else f"waiting: {r.message}"
            lines.append(f"  {label:<{width}}  {where}")
    lines.append("KV cache per replica:")
    for s in result.sizing:
        if s.kv is None:
            lines.append(f"  {s.deployment}: {s.note}")
            continue
        kv = s.kv
        lines.append(
            f"  {s.deployment}: {kv.gpus} x {_gib(kv.gpu_memory_bytes)} x {kv.gpu_memory_utilization:g} - weights "
            f"{_gib(kv.weights_bytes)} - overhead {_gib(kv.overhead_bytes)} = {_gib(kv.kv_cache_bytes)} KV; "
            f"{kv.bytes_per_block // 1024} KiB/block -> {kv.num_blocks} blocks, {kv.tokens} tokens, "
            f"{kv.max_seqs_at_max_len} sequences at max_model_len ({s.note})"
        )
    if result.profile and result.target_rps:
        rate = result.profile.requests_per_s
        lines.append(f"Replicas for {result.target_rps:g} req/s at {rate:g} req/s per replica (80% load):")
        for s in result.sizing:
            verdict = "ok" if s.configured_replicas >= (s.needed_replicas or 0) else "too few"
            lines.append(f"  {s.deployment}: need {s.needed_replicas}, configured {s.configured_replicas} ({verdict})")
    placed = sum(1 for p in result.pods if p.node)
    ready = sum(1 for r in result.replicas if r.node)
    summary = f"{placed}/{len(result.pods)} pods scheduled"
    if result.replicas:
        summary += f", {ready}/{len(result.replicas)} Serve replicas placed"
    lines.append(summary)
    return "\n".join(lines)
