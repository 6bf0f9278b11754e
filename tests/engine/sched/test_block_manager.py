"""Block manager: ref counts, LRU eviction of cached blocks, swap, and the invariant check itself."""

from __future__ import annotations

import pytest

from railyard.engine.sched.block_manager import BlockManager, BlockPool, prefix_block_hashes
from railyard.engine.config import SamplingParams
from railyard.engine.sched.sequence import Sequence


def _seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(i, f"r{i}", 0, tokens, SamplingParams(), 0.0)


def test_releasing_a_block_twice_is_refused():
    pool = BlockPool(2)
    b = pool.allocate()
    pool.release(b)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(b)


def test_unreferenced_cached_blocks_are_evicted_oldest_first():
    pool = BlockPool(3)
    blocks = [pool.allocate() for _ in range(3)]
    for h, b in enumerate(blocks):
        pool.register(b, 100 + h)
    for b in blocks:  # released in order: blocks[0] becomes the least recently used
        pool.release(b)
    assert pool.num_free == 3
    assert pool.allocate() == blocks[0]
    assert pool.lookup(100) is None and pool.lookup(101) == blocks[1]


def test_prefix_hit_shares_full_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(16, 0, block_size=4)
    first = _seq(0, list(range(12)))
    assert bm.admit(first, bm.find_cached_prefix(first), 12)
    first.num_computed_tokens = 12
    bm.cache_full_blocks(first)
    second = _seq(1, list(range(12)))  # identical: all 3 blocks cached, but the last token must run
    hits = bm.find_cached_prefix(second)
    assert hits == first.block_table[:2]
    assert bm.admit(second, hits, 12)
    assert second.num_computed_tokens == 8
    assert bm.gpu.ref_counts[first.block_table[0]] == 2
    bm.check_invariants([first, second])


def test_hash_chain_is_what_the_router_computes_from_token_ids():
    bm = BlockManager(8, 0, block_size=4)
    seq = _seq(0, list(range(10)))
    bm.admit(seq, [], 10)
    seq.num_computed_tokens = 10
    bm.cache_full_blocks(seq)
    assert set(prefix_block_hashes(list(range(10)), 4)) == bm.cached_block_hashes()


def test_swap_out_and_in_round_trips_blocks_through_the_cpu_pool():
    bm = BlockManager(4, 4, block_size=4, enable_prefix_caching=False)
    seq = _seq(0, list(range(10)))
    bm.admit(seq, [], 10)
    gpu_blocks = list(seq.block_table)
    out = bm.swap_out(seq)
    assert [g for g, _ in out] == gpu_blocks and not seq.block_table and len(seq.cpu_block_table) == 3
    assert bm.gpu.num_free == 4 and bm.cpu.num_free == 1
    back = bm.swap_in(seq)
    assert [c for c, _ in back] == [c for _, c in out]
    assert bm.cpu.num_free == 4 and len(seq.block_table) == 3
    bm.check_invariants([seq])


def test_invariant_check_detects_a_leaked_block():
    bm = BlockManager(4, 0, block_size=4)
    seq = _seq(0, list(range(6)))
    bm.admit(seq, [], 6)
    seq.block_table.pop()  # lose track of a block without releasing it
    with pytest.raises(AssertionError, match="ref 1 but 0 holders"):
        bm.check_invariants([seq])
