"""Ray Serve request routers for engine deployments.

`PendingPrefixRouter` (the default) ranks replicas on the load their engines report (EngineStats
through `record_routing_stats`, refreshed by the router's own count of requests it has sent since)
and on the prompt's prefix blocks each replica's KV cache really holds (the engine's block hash
chain, not the prompt text, under the request's LoRA adapter), with bounded load; a prefix no replica is known to
hold goes to its rendezvous replica, so the routers of several ingress processes agree without talking. A LoRA
adapter's request prefers the replicas that hold the adapter (they report which; the router remembers where it just
sent one), within the same bound (routing.py has the rule).

Adapter affinity is ours rather than Ray Serve's model multiplexing (@serve.multiplexed with
handle.options(multiplexed_model_id=...)), whose router keeps a request on the replicas holding its model until they
are full or a 0.1-0.2 s timeout passes, then tries those with the fewest models: that would lose the bounded-load
and prefix-cache ranking this router does, and its per-replica LRU unloads a model whatever requests still run with
it, where the engine's own slots and host tier never evict a running request's adapter.
`RoundRobinRouter` is the naive baseline for `railyard bench serve`.

Both return one replica per tier, so Ray tries them in our order and only skips a replica that
is at `max_ongoing_requests` or unreachable.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from railyard.engine.sched.block_manager import prefix_block_hashes
from railyard.serve import metrics
from railyard.serve.routing import (
    ReplicaLoad,
    RoutingOptions,
    current_pending,
    matched_prefix_blocks,
    prefix_key,
    rank,
)

log = logging.getLogger("railyard.serve")

_DEFAULT_BLOCK_SIZE = 16
_PROVISIONAL_TTL_S = 2.0  # a choice not confirmed by then was rejected or cancelled


def request_token_ids(pending_request: PendingRequest | None) -> list[int] | None:
    """The prompt token ids of an engine request (`EngineReplica.generate`'s first argument)."""
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    if isinstance(first, dict):
        ids = first.get("prompt_token_ids")
        return ids if isinstance(ids, list) else None
    return None


def request_lora_id(pending_request: PendingRequest | None) -> int:
    """The lora_int_id of an engine request's LoRA adapter (0: the base model, as the engine's hash chain has it)."""
    if pending_request is None or not pending_request.args or not isinstance(pending_request.args[0], dict):
        return 0
    lora = pending_request.args[0].get("lora")
    return getattr(lora, "lora_int_id", 0) or 0


def _prompt_hashes(pending_request: PendingRequest | None, block_size: int) -> list[int]:
    """The prompt's block hash chain under its adapter: a prefix cached for another adapter is no match."""
    token_ids = request_token_ids(pending_request)
    return prefix_block_hashes(token_ids, block_size, request_lora_id(pending_request)) if token_ids else []


class _CachedHashes:
    """A replica's reported prefix hashes as a set, rebuilt only when the replica reports a change."""

    __slots__ = ("hashes", "version")

    def __init__(self) -> None:
        self.version: Any = None
        self.hashes: frozenset[int] = frozenset()


class PendingPrefixRouter(RequestRouter):
    """Least pending work first; a replica already caching the prompt's prefix wins within a load bound."""

    def initialize_state(self, prefix_slack: int = 4, prefix_slack_ratio: float = 0.5,
                         min_prefix_blocks: int = 1, rendezvous_slack: int = 1, affinity_ttl_s: float = 30.0,
                         affinity_max_blocks: int = 100_000, **_: Any) -> None:
        self.options = RoutingOptions(prefix_slack, prefix_slack_ratio, min_prefix_blocks, rendezvous_slack)
        # Blocks of prompts we sent but the replica has not reported yet (its report lags by
        # request_routing_stats_period_s): without them a burst sharing a prefix would scatter.
        self._affinity_ttl_s = affinity_ttl_s
        self._affinity_max_blocks = affinity_max_blocks
        self._recent: dict[ReplicaID, OrderedDict[int, float]] = {}
        # (replica, lora_int_id) -> until when: an adapter we sent a replica that its report does not show yet
        self._adapter_sent: dict[tuple[ReplicaID, int], float] = {}
        self._reported: dict[ReplicaID, _CachedHashes] = {}
        # When the replica last told this router its own count of requests (accepting one we sent), and when its
        # report last changed, with what we sent it since: which of the two load figures is fresher (routing.py's
        # current_pending).
        self._accepted_at: dict[ReplicaID, float] = {}
        self._report_seen: dict[ReplicaID, _ReportSeen] = {}
        # Requests chosen for a replica but not yet confirmed sent (Ray counts them only once sent):
        # without this a burst routed in one go sees every replica equally idle and piles up at random.
        self._provisional: dict[str, tuple[str, float]] = {}
        self._rng = random.Random()

    # -- the decision ------------------------------------------------------------------------------
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        hashes = _prompt_hashes(pending_request, self._block_size(candidate_replicas))
        lora_id = request_lora_id(pending_request)
        now = time.monotonic()
        provisional = self._provisional_counts(now, pending_request)
        loads = [self._load(r, hashes, now, provisional.get(r.replica_id.unique_id, 0), lora_id)
                 for r in candidate_replicas]
        decision = rank(loads, self.options, self._rng, prefix_key(hashes, self.options), lora_id or None)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if pending_request is not None and decision.ranked:
            self._provisional[pending_request.metadata.internal_request_id] = (decision.ranked[0], now)
            if not pending_request.routing_context.should_backoff:
                metrics.record_routing_decision(self._deployment_id.name, decision.reason)
        # Ray retries choose_replicas after a full pass fails; back off from then on.
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        return [[by_id[rid]] for rid in decision.ranked]

    def _provisional_counts(self, now: float, current: PendingRequest | None) -> dict[str, int]:
        counts: dict[str, int] = {}
        if current is not None:  # a retry of the same request must not count against itself
            self._provisional.pop(current.metadata.internal_request_id, None)
        for key, (rid, chosen_at) in list(self._provisional.items()):
            if now - chosen_at > _PROVISIONAL_TTL_S:
                del self._provisional[key]
            else:
                counts[rid] = counts.get(rid, 0) + 1
        return counts

    def _load(self, replica: RunningReplica, hashes: list[int], now: float, provisional: int,
              lora_id: int = 0) -> ReplicaLoad:
        stats = replica.routing_stats or {}
        # Ray's count of requests at this replica (from the replica on every accept, plus our sends, minus our
        # completions) is fresher than the replica's periodic EngineStats report, which lags both ways (it still
        # shows a burst that just finished); the report fills in when Ray has no count, and caps one older than
        # the report, which other ingresses' completions have made too high (current_pending).
        rid = replica.replica_id
        seen = self._report_seen.setdefault(rid, _ReportSeen())
        seen.observe(stats, now)
        pending = current_pending(self.replica_queue_len_cache.get(rid), self._accepted_at.get(rid),
                                  int(stats.get("pending", 0)), seen.at, seen.sent_since) + provisional
        if stats.get("engine_dead"):  # until Serve replaces it, it only fails requests: last resort
            pending = max(pending, int(stats.get("pending", 0)))
        matched = 0
        if hashes:
            matched = matched_prefix_blocks(hashes, self._reported_hashes(replica))
            recent = self._recent.get(replica.replica_id)
            if recent:
                matched = max(matched, _matched_recent(hashes, recent, now))
        has_adapter = bool(lora_id) and (lora_id in (stats.get("lora_ids") or ())
                                         or self._adapter_sent.get((replica.replica_id, lora_id), 0.0) > now)
        return ReplicaLoad(replica.replica_id.unique_id, pending, int(stats.get("free_blocks", 0)), matched,
                           has_adapter)

    def _reported_hashes(self, replica: RunningReplica) -> frozenset[int]:
        stats = replica.routing_stats or {}
        entry = self._reported.setdefault(replica.replica_id, _CachedHashes())
        version = stats.get("prefix_version")
        if version != entry.version:
            entry.version = version
            entry.hashes = frozenset(stats.get("prefix_hashes") or ())
        return entry.hashes

    def _block_size(self, replicas: list[RunningReplica]) -> int:
        for r in replicas:
            size = (r.routing_stats or {}).get("block_size")
            if size:
                return int(size)
        return _DEFAULT_BLOCK_SIZE

    # -- lifecycle hooks ---------------------------------------------------------------------------
    def on_send_request(self, replica_id: ReplicaID) -> None:
        # Ray counts the request in its queue-length cache from now on: stop counting it ourselves
        # (the oldest choice for this replica is the one being sent), or a burst is counted twice.
        super().on_send_request(replica_id)
        if replica_id in self._report_seen:
            self._report_seen[replica_id].sent_since += 1
        rid = replica_id.unique_id
        for key, (chosen, _) in self._provisional.items():
            if chosen == rid:
                del self._provisional[key]
                break

    def on_new_queue_len_info(self, replica_id: ReplicaID, num_ongoing_requests: int) -> None:
        super().on_new_queue_len_info(replica_id, num_ongoing_requests)
        self._accepted_at[replica_id] = time.monotonic()

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        # Sent and accepted: Ray's queue-length cache counts it from now on.
        self._provisional.pop(pending_request.metadata.internal_request_id, None)
        replica = self.curr_replicas.get(replica_id)
        if replica is None:
            return
        expires = time.monotonic() + self._affinity_ttl_s
        lora_id = request_lora_id(pending_request)
        if lora_id:
            self._adapter_sent[(replica_id, lora_id)] = expires
        hashes = _prompt_hashes(pending_request, self._block_size([replica]))
        if not hashes:
            return
        recent = self._recent.setdefault(replica_id, OrderedDict())
        for h in hashes:
            recent[h] = expires
            recent.move_to_end(h)
        while len(recent) > self._affinity_max_blocks:
            recent.popitem(last=False)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for table in (self._recent, self._reported, self._accepted_at, self._report_seen):
            for rid in [rid for rid in table if rid not in live]:
                del table[rid]
        now = time.monotonic()
        for key in [k for k, until in self._adapter_sent.items() if k[0] not in live or until < now]:
            del self._adapter_sent[key]
        metrics.set_routable_replicas(self._deployment_id.name, len(live))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._recent.pop(replica_id, None)
        self._reported.pop(replica_id, None)
        self._accepted_at.pop(replica_id, None)
        self._report_seen.pop(replica_id, None)
        for key in [k for k in self._adapter_sent if k[0] == replica_id]:
            del self._adapter_sent[key]


class _ReportSeen:
    """When this router first saw a replica's current report, and what it has sent the replica since."""

    __slots__ = ("at", "sent_since", "signature")

    def __init__(self) -> None:
        self.signature: Any = None
        self.at: float | None = None
        self.sent_since = 0

    def observe(self, stats: dict[str, Any], now: float) -> None:
        if not stats:
            return
        # The prefix hashes are summarised by prefix_version; the rest are a few dozen numbers.
        signature = tuple(sorted((k, v) for k, v in stats.items() if k != "prefix_hashes"))
        if signature != self.signature:
            self.signature, self.at, self.sent_since = signature, now, 0


def _matched_recent(hashes: list[int], recent: OrderedDict[int, float], now: float) -> int:
    n = 0
    for h in hashes:
        expires = recent.get(h)
        if expires is None or expires < now:
            break
        n += 1
    return n


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in turn, blind to load and cache (the benchmark baseline)."""

    def initialize_state(self, **_: Any) -> None:
        self._next = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        start = self._next % len(ordered)
        self._next += 1
        if pending_request is not None:
            if not pending_request.routing_context.should_backoff:
                metrics.record_routing_decision(self._deployment_id.name, "round_robin")
            pending_request.routing_context.should_backoff = True
        return [[r] for r in ordered[start:] + ordered[:start]]


ROUTERS = {
    "pending_prefix": "railyard.serve.router:PendingPrefixRouter",
    "round_robin": "railyard.serve.router:RoundRobinRouter",
    "power_of_two": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
}
