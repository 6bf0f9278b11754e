"""The routing decision as plain data: rank replicas by pending work, with bounded prefix affinity.

Kept free of Ray so the rule reads in one place; `router.py` feeds it what the replicas report
(EngineStats: pending requests, free KV blocks, the prefix blocks their cache holds) plus what the
router itself knows more freshly (requests it just sent).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows about one replica at decision time."""

    replica_id: str
    pending: int  # unfinished requests: running + waiting + swapped (+ sent but not yet reported)
    free_blocks: int = 0
    matched_blocks: int = 0  # leading blocks of this prompt found in the replica's prefix cache


@dataclass(frozen=True)
class Decision:
    """Replicas best first (one per tier, so Ray keeps our order) and why the first won."""

    ranked: list[str]
    reason: str  # "prefix" | "least_pending"


def allowed_pending(min_pending: int, options: RoutingOptions) -> float:
    """The most pending work a prefix-affine replica may carry and still be preferred."""
    return min_pending + max(options.prefix_slack, options.prefix_slack_ratio * min_pending)


def rank(loads: list[ReplicaLoad], options: RoutingOptions = RoutingOptions(),
         rng: random.Random | None = None) -> Decision:
    """Affine replicas within the load bound first (longest match, then least pending), then the
    rest by least pending, most free KV blocks; exact ties are broken at random so idle replicas
    share work evenly."""
    if not loads:
        return Decision([], "least_pending")
    rng = rng or random
    jitter = {load.replica_id: rng.random() for load in loads}
    min_pending = min(load.pending for load in loads)
    bound = allowed_pending(min_pending, options)
    affine = [load for load in loads
              if load.matched_blocks >= options.min_prefix_blocks and load.pending <= bound]
    affine.sort(key=lambda x: (-x.matched_blocks, x.pending, -x.free_blocks, jitter[x.replica_id]))
    chosen = {load.replica_id for load in affine}
    rest = [load for load in loads if load.replica_id not in chosen]
    rest.sort(key=lambda x: (x.pending, -x.free_blocks, jitter[x.replica_id]))
    ranked = [load.replica_id for load in affine + rest]
    return Decision(ranked, "prefix" if affine else "least_pending")


def matched_prefix_blocks(prompt_hashes: list[int], cached: set[int] | frozenset[int]) -> int:
    """How many leading blocks of a prompt's hash chain a cache holds (a chain breaks at the first miss)."""
    n = 0
    for h in prompt_hashes:
        if h not in cached:
            break
        n += 1
    return n
