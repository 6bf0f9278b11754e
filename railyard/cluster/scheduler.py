"""A kube-scheduler simulation: default plugins' filters and scores, one pod at a time, binding as it goes.

Follows kube-scheduler (pkg/scheduler, default profile):
- Filters in plugin order, a node's reasons coming from the first plugin that rejects it: NodeUnschedulable,
  TaintToleration, NodeAffinity (with nodeSelector), NodeResourcesFit, PodTopologySpread, InterPodAffinity.
- An unschedulable pod gets FitError's message: "0/N nodes are available: " + the sorted "count reason"
  histogram + "." (e.g. "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.").
- Scores with the default weights: TaintToleration 3 (PreferNoSchedule), NodeResourcesFit 1 (LeastAllocated
  on cpu and memory: (allocatable - requested) * 100 / allocatable, averaged), PodTopologySpread 2,
  InterPodAffinity 2, NodeResourcesBalancedAllocation 1 ((1 - std of the cpu and memory fractions) * 100).
- percentageOfNodesToScore's adaptive default: with 100 or more nodes it stops filtering once it has found
  max(100, N * (50 - N/125)%) feasible nodes (at least 5%), starting where the previous pod stopped.
Differences: ties go to the first node in order (kube-scheduler picks at random); no preemption,
volumes, ports, images or preferred node affinity (railyard renders none).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass

from railyard.cluster.nodes import Node
from railyard.cluster.workload import DEFAULT_MEMORY, DEFAULT_MILLI_CPU, PodSpec, Term

MAX_SCORE = 100
UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
SPREAD = "node(s) didn't match pod topology spread constraints"
SPREAD_MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


@dataclass
class Placement:
    """Where one pod landed, or why it stays Pending (in kube-scheduler's words)."""

    pod: PodSpec
    node: str | None
    message: str = ""
    reasons: dict[str, int] | None = None


def _tolerates(tolerations: list[dict], key: str, value: str, effect: str) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != effect:
            continue
        op = tol.get("operator", "Equal")
        if not tol.get("key"):
            if op == "Exists":
                return True
            continue
        if tol["key"] != key:
            continue
        if op == "Exists" or str(tol.get("value", "")) == value:
            return True
    return False


def _expression_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def static_reason(pod: PodSpec, node: Node) -> str | None:
    """The first reason among the filters that depend only on the node (not on other pods), or None."""
    if node.unschedulable and not _tolerates(pod.tolerations, "node.kubernetes.io/unschedulable", "", "NoSchedule"):
        return UNSCHEDULABLE
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not _tolerates(
            pod.tolerations, taint.key, taint.value, taint.effect
        ):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return AFFINITY
    if pod.node_terms is not None and not any(
        all(_expression_matches(e, node.labels) for e in term) for term in pod.node_terms
    ):
        return AFFINITY
    return None


def fit_error(total: int, reasons: Counter) -> str:
    """kube-scheduler's FitError message for a pod no node can take."""
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{total} nodes are available: {', '.join(histogram)}."


def nodes_to_find(total: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering (adaptive default)."""
    if total < 100:
        return total
    percentage = max(5, 50 - total // 125)
    return max(100, total * percentage // 100)


def _matches(term: Term, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in term.selector)


class _GroupCache:
    """Per pod template: the nodes passing the static filters, and the reasons of those that do not."""

    def __init__(self, pod: PodSpec, nodes: list[Node]) -> None:
        self.feasible: list[int] = []
        self.reasons: Counter = Counter()
        self.prefer_no_schedule: dict[int, int] = {}
        for i, node in enumerate(nodes):
            reason = static_reason(pod, node)
            if reason is None:
                self.feasible.append(i)
                bad = sum(
                    1
                    for t in node.taints
                    if t.effect == "PreferNoSchedule" and not _tolerates(pod.tolerations, t.key, t.value, t.effect)
                )
                if bad:
                    self.prefer_no_schedule[i] = bad
            else:
                self.reasons[reason] += 1
        self.domains: dict[str, set[str]] = {}
        for term in pod.spread_hard + pod.spread_soft:
            self.domains[term.topology_key] = {
                nodes[i].labels[term.topology_key] for i in self.feasible if term.topology_key in nodes[i].labels
            }


class KubeScheduler:
    """kube-scheduler's filter and score, simulated: places pods one by one on a set of nodes, charging each bound
    pod to its node (the nodes change). Not the engine's Scheduler, which batches sequences."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.next_start = 0
        self._groups: dict[str, _GroupCache] = {}
        # (selector, topologyKey) -> domain -> number of bound pods matching the selector there
        self._counts: dict[tuple, Counter] = {}
        # existing pods' required anti-affinity: (selector, topologyKey) -> domains they hold
        self._existing_anti: dict[tuple, Counter] = {}
        self._bound: list[tuple[dict[str, str], int]] = []
        self._alloc: dict[str, list[int]] = {}
        self._used: dict[str, list[int]] = {}
        self._alloc_cpu = [n.allocatable.get("cpu", 0) for n in nodes]
        self._alloc_mem = [n.allocatable.get("memory", 0) for n in nodes]
        self._req_cpu = [n.requested.get("cpu", 0) for n in nodes]
        self._req_mem = [n.requested.get("memory", 0) for n in nodes]
        self._nonzero_cpu = [n.requested.get("cpu", 0) for n in nodes]
        self._nonzero_mem = [n.requested.get("memory", 0) for n in nodes]

    def _track(self, term: Term) -> Counter:
        key = (term.selector, term.topology_key)
        counts = self._counts.get(key)
        if counts is None:
            # A selector first seen now still counts the pods bound before it.
            counts = self._counts[key] = Counter()
            for labels, i in self._bound:
                domain = self.nodes[i].labels.get(term.topology_key)
                if domain is not None and all(labels.get(k) == v for k, v in term.selector):
                    counts[domain] += 1
        return counts

    def _dynamic_reasons(self, pod: PodSpec, node: Node, cache: _GroupCache) -> list[str]:
        reasons = []
        if node.pods + 1 > node.allocatable.get("pods", 110):
            reasons.append("Too many pods")
        requested, allocatable = node.requested, node.allocatable
        for resource, amount in pod.requests.items():
            if amount and requested.get(resource, 0) + amount > allocatable.get(resource, 0):
                reasons.append(f"Insufficient {resource}")
        if reasons or not (pod.spread_hard or pod.anti_required or self._existing_anti):
            return reasons
        for term in pod.spread_hard:
            domain = node.labels.get(term.topology_key)
            if domain is None:
                return [SPREAD_MISSING_LABEL]
            counts = self._track(term)
            low = min((counts.get(d, 0) for d in cache.domains[term.topology_key]), default=0)
            if counts.get(domain, 0) + (1 if _matches(term, pod.labels) else 0) - low > term.max_skew:
                return [SPREAD]
        for term in pod.anti_required:
            domain = node.labels.get(term.topology_key)
            if domain is not None and self._track(term).get(domain, 0) > 0:
                return [ANTI_AFFINITY]
        for (selector, key), domains in self._existing_anti.items():
            domain = node.labels.get(key)
            if domain is not None and domains.get(domain) and all(pod.labels.get(k) == v for k, v in selector):
                return [EXISTING_ANTI_AFFINITY]
        return []

    def _scores(self, pod: PodSpec, candidates: list[int], cache: _GroupCache) -> list[float]:
        # Hot path (every feasible node of every pod): per-node arrays, terms hoisted out of the loop.
        nodes = self.nodes
        alloc_cpu, alloc_mem = self._alloc_cpu, self._alloc_mem
        req_cpu, req_mem = self._req_cpu, self._req_mem
        nz_cpu_used, nz_mem_used = self._nonzero_cpu, self._nonzero_mem
        pod_cpu, pod_mem = pod.requests.get("cpu", 0), pod.requests.get("memory", 0)
        nz_cpu = pod_cpu or DEFAULT_MILLI_CPU
        nz_mem = pod_mem or DEFAULT_MEMORY
        totals = []
        for i in candidates:
            a_cpu, a_mem = alloc_cpu[i], alloc_mem[i]
            least = 0
            used = nz_cpu_used[i] + nz_cpu
            if a_cpu and used <= a_cpu:
                least += (a_cpu - used) * MAX_SCORE // a_cpu
            used = nz_mem_used[i] + nz_mem
            if a_mem and used <= a_mem:
                least += (a_mem - used) * MAX_SCORE // a_mem
            if a_cpu and a_mem:
                f_cpu = (req_cpu[i] + pod_cpu) / a_cpu
                f_mem = (req_mem[i] + pod_mem) / a_mem
                if f_cpu > 1.0:
                    f_cpu = 1.0
                if f_mem > 1.0:
                    f_mem = 1.0
                balanced = int((1 - abs(f_cpu - f_mem) / 2) * MAX_SCORE)
            else:
                balanced = MAX_SCORE
            totals.append(least // 2 + balanced)
        # TaintToleration: fewer intolerable PreferNoSchedule taints is better (normalized, reversed).
        if cache.prefer_no_schedule:
            raw = [cache.prefer_no_schedule.get(i, 0) for i in candidates]
            top = max(raw)
            for k, value in enumerate(raw):
                totals[k] += 3 * (MAX_SCORE - (MAX_SCORE * value // top if top else 0))
        else:
            totals = [t + 3 * MAX_SCORE for t in totals]
        # InterPodAffinity: each matching pod already in the domain costs the term's weight.
        if pod.anti_preferred:
            terms = [(t.weight, t.topology_key, self._track(t)) for t in pod.anti_preferred]
            raw = [0] * len(candidates)
            for weight, key, counts in terms:
                if not counts:
                    continue
                for k, i in enumerate(candidates):
                    domain = nodes[i].labels.get(key)
                    if domain is not None:
                        raw[k] -= weight * counts.get(domain, 0)
            low, high = min(raw), max(raw)
            if high > low:
                span = high - low
                for k, value in enumerate(raw):
                    totals[k] += 2 * int(MAX_SCORE * (value - low) / span)
        # PodTopologySpread (ScheduleAnyway): fewer matching pods in the node's domain is better.
        if pod.spread_soft:
            terms = [
                (t.topology_key, self._track(t), math.log(len(cache.domains[t.topology_key]) + 2), t.max_skew - 1)
                for t in pod.spread_soft
            ]
            raw_spread: list[int | None] = []
            for i in candidates:
                labels = nodes[i].labels
                score = 0.0
                for key, counts, weight, skew in terms:
                    domain = labels.get(key)
                    if domain is None:
                        score = None
                        break
                    score += counts.get(domain, 0) * weight + skew
                raw_spread.append(None if score is None else round(score))
            present = [v for v in raw_spread if v is not None]
            high, low = (max(present), min(present)) if present else (0, 0)
            for k, value in enumerate(raw_spread):
                if value is None:
                    continue
                totals[k] += 2 * (MAX_SCORE if high == 0 else MAX_SCORE * (high + low - value) // high)
        return totals

    def _array(self, table: dict[str, list[int]], resource: str) -> list[int]:
        """Per-node allocatable (or used) amounts of one resource, built on first use."""
        values = table.get(resource)
        if values is None:
            if table is self._alloc:
                default = 110 if resource == "pods" else 0
                values = [n.allocatable.get(resource, default) for n in self.nodes]
            else:
                values = [n.pods if resource == "pods" else n.requested.get(resource, 0) for n in self.nodes]
            table[resource] = values
        return values

    def _bind(self, pod: PodSpec, i: int) -> None:
        node = self.nodes[i]
        for resource, amount in pod.requests.items():
            node.requested[resource] = node.requested.get(resource, 0) + amount
            if resource in self._used:
                self._used[resource][i] += amount
        node.pods += 1
        if "pods" in self._used:
            self._used["pods"][i] += 1
        self._bound.append((pod.labels, i))
        self._req_cpu[i] += pod.requests.get("cpu", 0)
        self._req_mem[i] += pod.requests.get("memory", 0)
        self._nonzero_cpu[i] += pod.requests.get("cpu", 0) or DEFAULT_MILLI_CPU
        self._nonzero_mem[i] += pod.requests.get("memory", 0) or DEFAULT_MEMORY
        for (selector, key), counts in self._counts.items():
            domain = node.labels.get(key)
            if domain is not None and all(pod.labels.get(k) == v for k, v in selector):
                counts[domain] += 1
        for term in pod.anti_required:
            domain = node.labels.get(term.topology_key)
            if domain is not None:
                self._existing_anti.setdefault((term.selector, term.topology_key), Counter())[domain] += 1

    def schedule(self, pod: PodSpec) -> Placement:
        """Filter, score and bind one pod; a pod that fits nowhere is returned with FitError's message."""
        cache = self._groups.get(pod.group)
        if cache is None:
            cache = self._groups[pod.group] = _GroupCache(pod, self.nodes)
            for term in pod.anti_required + pod.anti_preferred + pod.spread_hard + pod.spread_soft:
                self._track(term)
        total = len(self.nodes)
        if total == 0:
            return Placement(pod, None, "0/0 nodes are available: no nodes.", {})
        wanted = nodes_to_find(total)
        start = self.next_start
        order = cache.feasible
        first = bisect_left(order, start)
        feasible: list[int] = []
        reasons = Counter()
        stopped_at = None
        # Fast path: plain resource arithmetic on per-resource arrays; the full filter (with its reasons)
        # runs only for nodes that fail it, or when the pod has spread or anti-affinity terms.
        checks = [(self._array(self._alloc, r), self._array(self._used, r), a) for r, a in pod.requests.items() if a]
        pods_alloc, pods_used = self._array(self._alloc, "pods"), self._array(self._used, "pods")
        simple = not (pod.spread_hard or pod.anti_required or self._existing_anti)
        count = len(order)
        for k in range(count):
            i = order[(first + k) % count]
            fits = pods_used[i] < pods_alloc[i]
            if fits:
                for alloc, used, amount in checks:
                    if used[i] + amount > alloc[i]:
                        fits = False
                        break
            if not (fits and simple):
                why = self._dynamic_reasons(pod, self.nodes[i], cache)
                if why:
                    reasons.update(why)
                    continue
            feasible.append(i)
            if len(feasible) >= wanted:
                stopped_at = i
                break
        processed = total if stopped_at is None else (stopped_at - start) % total + 1
        self.next_start = (start + processed) % total
        if not feasible:
            reasons.update(cache.reasons)
            return Placement(pod, None, fit_error(total, reasons), dict(reasons))
        scores = self._scores(pod, feasible, cache)
        best = feasible[max(range(len(feasible)), key=scores.__getitem__)]
        self._bind(pod, best)
        return Placement(pod, self.nodes[best].name)

    def schedule_all(self, pods: list[PodSpec]) -> list[Placement]:
        """Schedule pods in order (as the scheduling queue pops equal-priority pods: by creation)."""
        return [self.schedule(pod) for pod in pods]
