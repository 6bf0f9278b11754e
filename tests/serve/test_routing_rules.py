"""The routing rule itself (no Ray): least pending first, prefix affinity within a load bound."""

from __future__ import annotations

import random

from railyard.engine.block_manager import prefix_block_hashes
from railyard.serve.routing import (
    ReplicaLoad,
    RoutingOptions,
    allowed_pending,
    matched_prefix_blocks,
    rank,
)


def test_the_least_pending_replica_comes_first():
    decision = rank([ReplicaLoad("a", 5), ReplicaLoad("b", 1), ReplicaLoad("c", 3)])
    assert decision.ranked == ["b", "c", "a"]
    assert decision.reason == "least_pending"


def test_equal_load_is_broken_by_free_kv_blocks_then_at_random():
    assert rank([ReplicaLoad("a", 2, free_blocks=10), ReplicaLoad("b", 2, free_blocks=90)]).ranked[0] == "b"
    firsts = {rank([ReplicaLoad("a", 0), ReplicaLoad("b", 0)], rng=random.Random(seed)).ranked[0]
              for seed in range(20)}
    assert firsts == {"a", "b"}


def test_a_replica_caching_the_prefix_wins_while_within_the_load_bound():
    decision = rank([ReplicaLoad("idle", 0), ReplicaLoad("warm", 3, matched_blocks=8)])
    assert decision.ranked == ["warm", "idle"]
    assert decision.reason == "prefix"


def test_a_much_busier_replica_loses_its_prefix_affinity():
    options = RoutingOptions(prefix_slack=4, prefix_slack_ratio=0.5)
    assert allowed_pending(0, options) == 4
    decision = rank([ReplicaLoad("idle", 0), ReplicaLoad("warm", 5, matched_blocks=8)], options)
    assert decision.ranked == ["idle", "warm"]
    assert decision.reason == "least_pending"


def test_the_bound_grows_with_the_fleet_load():
    options = RoutingOptions(prefix_slack=4, prefix_slack_ratio=0.5)
    # Everyone is busy: 20 pending on the least loaded, so a warm cache is worth 10 more.
    decision = rank([ReplicaLoad("cold", 20), ReplicaLoad("warm", 29, matched_blocks=2)], options)
    assert decision.ranked[0] == "warm"


def test_the_longest_cached_prefix_wins_among_affine_replicas():
    decision = rank([ReplicaLoad("short", 1, matched_blocks=2), ReplicaLoad("long", 2, matched_blocks=6),
                     ReplicaLoad("none", 0)])
    assert decision.ranked == ["long", "short", "none"]


def test_a_prefix_match_counts_leading_blocks_only_up_to_the_first_miss():
    prompt = list(range(100))
    hashes = prefix_block_hashes(prompt, 16)  # 6 full blocks
    other = prefix_block_hashes(list(range(50)) + [7] * 50, 16)
    cache = set(other)  # shares the first 3 blocks, then diverges
    assert matched_prefix_blocks(hashes, cache) == 3
    assert matched_prefix_blocks(hashes, set(hashes[1:])) == 0  # a chain without its first block matches nothing
    assert matched_prefix_blocks(hashes, set(hashes)) == 6
