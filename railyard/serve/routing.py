"""The routing decision as plain data: rank replicas by pending work, with bounded prefix and LoRA adapter affinity.

Kept free of Ray so the rule reads in one place; `router.py` feeds it what the replicas report
(EngineStats: pending requests, free KV blocks, the prefix blocks their cache holds) plus what the
router itself knows more freshly (requests it just sent).

Every ingress process has its own router and none talks to another: what one sent a replica the others learn
only from the replica's next report. So a prefix nobody is known to hold goes where every router would send it
without asking: to the replica that rendezvous (highest-random-weight) hashing picks for the prompt's leading
block among those at most rendezvous_slack busier than the least loaded (the same answer in every process while
their load views roughly agree; a replica coming or going moves only the prefixes it wins or held).

A request for a LoRA adapter goes, after a replica caching its prefix (hashed under the adapter, so a prefix cached
for another adapter or the base model is no hit), to a replica that has the adapter loaded, while that one is within
the same load bound; when none has it, to the adapter's rendezvous replica (every ingress loads a new adapter on the
same replica, not one each); when every holder is busier than the bound, to the least loaded replica, which loads
it too (spilling by load, as Ray Serve's model multiplexing falls back to other replicas).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RoutingOptions:
    """How much extra load a prefix hit may cost before plain load balancing wins."""

    # A replica holding the prompt's prefix is preferred while its pending work is at most
    # min_pending + max(prefix_slack, prefix_slack_ratio * min_pending) (bounded load).
    prefix_slack: int = 4
    prefix_slack_ratio: float = 0.5
    # Blocks a prefix must share before affinity counts (one block of a system prompt is noise).
    min_prefix_blocks: int = 1
    # A prefix no replica holds goes to its rendezvous replica while that one carries at most this much more
    # pending work than the least loaded (and is within the bound above): a smaller detour than affinity's, since
    # what it buys is only likely (the prefix's next request, through another ingress, finds it there).
    rendezvous_slack: int = 1


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows about one replica at decision time."""

    replica_id: str
    pending: int  # unfinished requests: running + waiting + swapped (+ sent but not yet reported)
    free_blocks: int = 0
    matched_blocks: int = 0  # leading blocks of this prompt found in the replica's prefix cache
    has_adapter: bool = False  # the request's LoRA adapter is loaded there (or was just sent there)


@dataclass(frozen=True)
class Decision:
    """Replicas best first (one per tier, so Ray keeps our order) and why the first won."""

    ranked: list[str]
    reason: str  # "prefix" | "adapter" | "adapter_rendezvous" | "rendezvous" | "least_pending"


def allowed_pending(min_pending: int, options: RoutingOptions) -> float:
    """The most pending work a prefix-affine replica may carry and still be preferred."""
    return min_pending + max(options.prefix_slack, options.prefix_slack_ratio * min_pending)


def rank(loads: list[ReplicaLoad], options: RoutingOptions = RoutingOptions(),
         rng: random.Random | None = None, prefix_key: int | None = None, adapter_key: int | None = None) -> Decision:
    """Affine replicas within the load bound first (longest match, then least pending); for a LoRA adapter's request
    (adapter_key: its lora_int_id, the same in every ingress process) next the replicas holding the adapter within that
    bound, or, where none holds it, the adapter's rendezvous replica; else, for a prompt with a prefix key, the
    rendezvous replica among those within rendezvous_slack of the least loaded; then the rest by least pending, most
    free KV blocks; exact ties are broken at random so idle replicas share work evenly."""
    if not loads:
        return Decision([], "least_pending")
    rng = rng or random
    jitter = {load.replica_id: rng.random() for load in loads}
    min_pending = min(load.pending for load in loads)
    bound = allowed_pending(min_pending, options)
    affine = [load for load in loads
              if load.matched_blocks >= options.min_prefix_blocks and load.pending <= bound]
    affine.sort(key=lambda x: (-x.matched_blocks, x.pending, -x.free_blocks, jitter[x.replica_id]))
    reason = "prefix" if affine else "least_pending"
    if not affine and adapter_key is not None:
        affine = [load for load in loads if load.has_adapter and load.pending <= bound]
        affine.sort(key=lambda x: (x.pending, -x.free_blocks, jitter[x.replica_id]))
        reason = "adapter"
        if not affine and not any(load.has_adapter for load in loads):
            affine = [_rendezvous(loads, adapter_key, min(bound, min_pending + options.rendezvous_slack))]
            reason = "adapter_rendezvous"
        elif not affine:  # every holder is busier than the bound: spill to the least loaded, which loads it too
            reason = "least_pending"
            prefix_key = None
    if not affine and prefix_key is not None:
        affine = [_rendezvous(loads, prefix_key, min(bound, min_pending + options.rendezvous_slack))]
        reason = "rendezvous"
    chosen = {load.replica_id for load in affine}
    rest = [load for load in loads if load.replica_id not in chosen]
    rest.sort(key=lambda x: (x.pending, -x.free_blocks, jitter[x.replica_id]))
    return Decision([load.replica_id for load in affine + rest], reason)


def _rendezvous(loads: list[ReplicaLoad], key: int, max_pending: float) -> ReplicaLoad:
    """The replica a key's rendezvous hashing picks among those carrying at most max_pending."""
    return max((load for load in loads if load.pending <= max_pending),
               key=lambda x: rendezvous_weight(key, x.replica_id))


def prefix_key(prompt_hashes: list[int], options: RoutingOptions = RoutingOptions()) -> int | None:
    """What rendezvous hashing places a prompt by: the hash of its first min_prefix_blocks blocks (the chain's
    hash covers every block before it), or None for a prompt shorter than that (placed by load alone)."""
    n = options.min_prefix_blocks
    return prompt_hashes[n - 1] if n >= 1 and len(prompt_hashes) >= n else None


def rendezvous_weight(key: int, replica_id: str) -> int:
    """A replica's highest-random-weight score for a key: the same in every process (a keyed digest, not Python's
    per-process salted str hash), independent across replicas."""
    digest = hashlib.blake2b(f"{key}/{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def current_pending(queued: int | None, queued_at: float | None, reported: int, reported_at: float | None,
                    sent_since_report: int) -> int:
    """A replica's unfinished requests as one router best knows them.

    `queued` is Ray's queue-length cache: the replica's own count when it last accepted a request from this router
    (at `queued_at`), plus this router's later sends, minus its completions. With several routers (one per ingress
    process) it never sees the others' completions, so for a replica this router stopped sending to it stays high
    and keeps it away (a stale count that feeds itself). While that count is older than the replica's last report
    (seen at `reported_at`), the report plus what this router sent since caps it. Without a count, the report alone
    (what we sent since may have finished: counting it would keep a replica looking busy the same way)."""
    if queued is None:
        return reported
    if reported_at is not None and (queued_at is None or queued_at < reported_at):
        return min(queued, reported + sent_since_report)
    return queued


def matched_prefix_blocks(prompt_hashes: list[int], cached: set[int] | frozenset[int]) -> int:
    """How many leading blocks of a prompt's hash chain a cache holds (a chain breaks at the first miss)."""
    n = 0
    for h in prompt_hashes:
        if h not in cached:
            break
        n += 1
    return n
