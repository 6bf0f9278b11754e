"""The routing rule itself (no Ray): least pending first, prefix and LoRA adapter affinity within a load bound."""

from __future__ import annotations

import random

from railyard.engine.sched.block_manager import prefix_block_hashes
from railyard.serve.routing import (
    ReplicaLoad,
    RoutingOptions,
    allowed_pending,
    current_pending,
    matched_prefix_blocks,
    prefix_key,
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


def _idle(*names: str, pending: int = 0) -> list[ReplicaLoad]:
    return [ReplicaLoad(name, pending) for name in names]


def test_a_new_prefix_goes_to_the_same_replica_whatever_router_or_order_decides():
    """Two ingress processes (each its own router and random ties) placing the same new prefix agree."""
    key = prefix_key(prefix_block_hashes(list(range(64)), 16))
    firsts = {rank(loads, rng=random.Random(seed), prefix_key=key).ranked[0]
              for seed in range(20) for loads in (_idle("a", "b", "c"), _idle("c", "b", "a"))}
    assert len(firsts) == 1
    assert rank(_idle("a", "b", "c"), prefix_key=key).reason == "rendezvous"


def test_new_prefixes_spread_over_the_replicas():
    keys = [prefix_key(prefix_block_hashes([doc] * 32, 16)) for doc in range(64)]
    homes = [rank(_idle("a", "b"), prefix_key=key).ranked[0] for key in keys]
    assert 20 <= homes.count("a") <= 44, homes.count("a")  # each prefix's home is a fair coin: 32 +- 3 sigma


def test_a_prefix_keeps_its_replica_when_another_replica_leaves_or_joins():
    keys = [prefix_key(prefix_block_hashes([doc] * 32, 16)) for doc in range(32)]
    before = {key: rank(_idle("a", "b", "c"), prefix_key=key).ranked[0] for key in keys}
    for key, home in before.items():
        others = [r for r in "abc" if r != home]
        assert rank(_idle(home, others[0]), prefix_key=key).ranked[0] == home  # one of the others left
        assert rank(_idle("a", "b", "c", "d"), prefix_key=key).ranked[0] in (home, "d")  # a new one joined


def test_the_rendezvous_replica_is_skipped_while_busier_than_its_small_slack_allows():
    """A new prefix's home may carry 2 more requests than the least loaded (affinity to a cached prefix: 4)."""
    key = prefix_key(prefix_block_hashes(list(range(64)), 16))
    home = rank(_idle("a", "b"), prefix_key=key).ranked[0]
    other = "b" if home == "a" else "a"
    options = RoutingOptions(prefix_slack=4, prefix_slack_ratio=0.5, rendezvous_slack=2)
    within = rank([ReplicaLoad(home, 2), ReplicaLoad(other, 0)], options, prefix_key=key)
    assert within.ranked[0] == home
    busier = rank([ReplicaLoad(home, 3), ReplicaLoad(other, 0)], options, prefix_key=key)
    assert busier.ranked == [other, home]
    # Never beyond the affinity bound, whatever the slack says.
    wide = RoutingOptions(prefix_slack=4, prefix_slack_ratio=0.5, rendezvous_slack=10)
    assert rank([ReplicaLoad(home, 5), ReplicaLoad(other, 0)], wide, prefix_key=key).ranked == [other, home]


def test_a_replica_holding_the_prefix_wins_over_the_rendezvous_replica():
    key = prefix_key(prefix_block_hashes(list(range(64)), 16))
    home = rank(_idle("a", "b"), prefix_key=key).ranked[0]
    other = "b" if home == "a" else "a"
    decision = rank([ReplicaLoad(home, 0), ReplicaLoad(other, 1, matched_blocks=4)], prefix_key=key)
    assert decision.ranked == [other, home]
    assert decision.reason == "prefix"


def test_a_prompt_shorter_than_the_affinity_minimum_has_no_prefix_key():
    assert prefix_key(prefix_block_hashes(list(range(15)), 16)) is None
    hashes = prefix_block_hashes(list(range(40)), 16)
    assert prefix_key(hashes) == hashes[0]
    assert prefix_key(hashes, RoutingOptions(min_prefix_blocks=2)) == hashes[1]
    assert prefix_key(hashes, RoutingOptions(min_prefix_blocks=3)) is None


def test_a_queue_count_fresher_than_the_report_is_used_as_is():
    # Accepted at t=5 (the replica's own count then, plus our sends since), report seen at t=4: the count wins,
    # even above the report (the report misses what other ingresses sent since).
    assert current_pending(queued=9, queued_at=5.0, reported=3, reported_at=4.0, sent_since_report=1) == 9
    assert current_pending(queued=1, queued_at=5.0, reported=3, reported_at=4.0, sent_since_report=1) == 1


def test_a_queue_count_older_than_the_report_is_capped_by_the_report():
    """The GPU run's stale count: the last accept (t=1) counted another ingress's 60 requests, which finished
    without this router seeing it; the report seen at t=9 shows 2 pending, and we sent 1 since."""
    assert current_pending(queued=60, queued_at=1.0, reported=2, reported_at=9.0, sent_since_report=1) == 3
    assert current_pending(queued=1, queued_at=1.0, reported=2, reported_at=9.0, sent_since_report=1) == 1


def test_without_a_queue_count_the_report_decides():
    # Our 3 sends since the report may have finished: the report alone, as Ray's own routers do without a count.
    assert current_pending(queued=None, queued_at=None, reported=2, reported_at=9.0, sent_since_report=3) == 2
    assert current_pending(queued=None, queued_at=None, reported=0, reported_at=None, sent_since_report=0) == 0


# -- LoRA adapters: affinity to the replicas holding the adapter, within the same load bound ----------------------
ADAPTER = 7  # the request's lora_int_id


def test_an_adapter_request_goes_to_a_replica_holding_the_adapter_while_within_the_load_bound():
    decision = rank([ReplicaLoad("idle", 0), ReplicaLoad("holder", 3, has_adapter=True)], adapter_key=ADAPTER)
    assert decision.ranked == ["holder", "idle"]
    assert decision.reason == "adapter"


def test_the_least_loaded_of_several_holders_wins():
    decision = rank([ReplicaLoad("busy", 3, has_adapter=True), ReplicaLoad("idle", 0),
                     ReplicaLoad("calm", 1, has_adapter=True)], adapter_key=ADAPTER)
    assert decision.ranked[:2] == ["calm", "busy"]


def test_an_adapter_request_spills_to_the_least_loaded_replica_when_every_holder_is_busy():
    options = RoutingOptions(prefix_slack=4, prefix_slack_ratio=0.5)
    decision = rank([ReplicaLoad("holder", 9, has_adapter=True), ReplicaLoad("idle", 0), ReplicaLoad("calm", 2)],
                    options, adapter_key=ADAPTER)
    assert decision.ranked == ["idle", "calm", "holder"]
    assert decision.reason == "least_pending"


def test_an_adapter_no_replica_holds_goes_to_its_rendezvous_replica_whatever_router_decides():
    replicas = [f"replica-{i}" for i in range(6)]
    firsts = {rank([ReplicaLoad(r, 0) for r in random.Random(seed).sample(replicas, 6)], rng=random.Random(seed),
                   adapter_key=ADAPTER).ranked[0] for seed in range(10)}
    assert len(firsts) == 1
    # ... not the replica a prompt's prefix alone would pick: the adapter is placed, the prefix follows it
    assert rank([ReplicaLoad(r, 0) for r in replicas], adapter_key=ADAPTER, prefix_key=1).reason == \
        "adapter_rendezvous"
    placed = {rank([ReplicaLoad(r, 0) for r in replicas], adapter_key=key).ranked[0] for key in range(1, 40)}
    assert len(placed) > 3  # different adapters land on different replicas


def test_a_replica_caching_the_prompt_under_the_adapter_wins_over_a_mere_holder():
    decision = rank([ReplicaLoad("holder", 0, has_adapter=True), ReplicaLoad("warm", 2, matched_blocks=4,
                                                                            has_adapter=True)], adapter_key=ADAPTER)
    assert decision.ranked == ["warm", "holder"]
    assert decision.reason == "prefix"


def test_a_prefix_cached_under_one_adapter_is_no_hit_for_another_or_for_the_base_model():
    prompt = list(range(64))
    cached_under_a = set(prefix_block_hashes(prompt, 16, lora_int_id=1))
    assert matched_prefix_blocks(prefix_block_hashes(prompt, 16, lora_int_id=1), cached_under_a) == 4
    assert matched_prefix_blocks(prefix_block_hashes(prompt, 16, lora_int_id=2), cached_under_a) == 0
    assert matched_prefix_blocks(prefix_block_hashes(prompt, 16), cached_under_a) == 0


def test_a_base_model_request_ignores_which_adapters_replicas_hold():
    decision = rank([ReplicaLoad("holder", 2, has_adapter=True), ReplicaLoad("idle", 0)])
    assert decision.ranked == ["idle", "holder"]
