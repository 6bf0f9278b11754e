"""Sliding-window layers' blocks: a sequence holds only the blocks its window can still see, prefix hits bring the
window's blocks with them (or shrink to a hit whose window is still cached), swaps move both tables, and random
add / step / abort runs never leak a block nor schedule a token whose window is not held."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.sched.block_manager import NO_BLOCK, BlockManager, check_kv_fits
from railyard.errors import ConfigError
from railyard.engine.sched.scheduler import Scheduler
from railyard.engine.sched.sequence import Sequence
from tests.engine.sched.test_scheduler_properties import MAX_LEN, config_st, op_st

BS = 4


def _seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(i, f"r{i}", 0, tokens, SamplingParams(), 0.0)


def _run(bm: BlockManager, seq: Sequence, num_tokens: int) -> None:
    """Compute the sequence up to num_tokens, one token at a time (as decode steps would)."""
    while seq.num_computed_tokens < num_tokens:
        assert bm.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
        bm.cache_full_blocks(seq)


def test_a_long_sequence_holds_only_its_windows_blocks_in_the_sliding_layers():
    bm = BlockManager(64, 0, block_size=BS, sliding_window=6)
    seq = _seq(0, list(range(40)))
    assert bm.admit(seq, [], 1)
    _run(bm, seq, 40)
    assert len(seq.block_table) == 10
    live = [i for i, b in enumerate(seq.sliding_table) if b != NO_BLOCK]
    # The next query (position 40) sees 35..40: blocks 8 (32..35), 9 and the one it will be written to.
    assert bm.allocate_slots(seq, 1) and live[0] <= 8
    live = [i for i, b in enumerate(seq.sliding_table) if b != NO_BLOCK]
    assert live == [8, 9, 10]
    assert bm.num_used_blocks == 11 + 3
    bm.check_invariants([seq])


def test_a_prefix_hit_takes_the_cached_sliding_blocks_of_its_window():
    bm = BlockManager(64, 0, block_size=BS, sliding_window=6)
    first = _seq(0, list(range(30)))
    assert bm.admit(first, bm.find_cached_prefix(first), 30)
    first.num_computed_tokens = 30
    bm.cache_full_blocks(first)
    second = _seq(1, list(range(30)) + [99])
    hits = bm.find_cached_prefix(second)
    assert hits == first.block_table[:7]
    assert bm.admit(second, hits, 31)
    # Position 28 comes next: its window starts at 23, in block 5.
    assert second.sliding_table[:5] == [NO_BLOCK] * 5
    assert second.sliding_table[5:7] == first.sliding_table[5:7]
    assert second.num_computed_tokens == 28
    bm.check_invariants([first, second])


def _evict(bm: BlockManager, key) -> None:
    """Evict one unreferenced cached block, as the LRU would once the pool ran short."""
    block = bm.gpu.lookup(key)
    del bm.gpu.cached[key], bm.gpu.evictable[block]
    bm.gpu.block_hash[block] = None
    bm.gpu.free.append(block)


def test_a_prefix_hit_shrinks_to_where_the_window_is_still_cached():
    bm = BlockManager(64, 0, block_size=BS, sliding_window=6)
    first = _seq(0, list(range(30)))
    assert bm.admit(first, [], 30)
    first.num_computed_tokens = 30
    bm.cache_full_blocks(first)
    bm.free(first)
    again = _seq(1, list(range(30)))
    assert len(bm.find_cached_prefix(again)) == 7
    # Without the sliding block of tokens 20..23: a hit of 7 blocks (next position 28, window 23..28) needs it, so
    # does one of 6 (window 19..24); one of 5 (window 15..20) does not.
    _evict(bm, ("sliding", again.block_hashes[5]))
    assert len(bm.find_cached_prefix(again)) == 5
    assert bm.admit(again, bm.find_cached_prefix(again), 30)
    assert again.num_computed_tokens == 20
    bm.check_invariants([again])


def test_swap_moves_the_live_sliding_blocks_and_keeps_the_freed_entries():
    bm = BlockManager(64, 32, block_size=BS, sliding_window=6, enable_prefix_caching=False)
    seq = _seq(0, list(range(30)))
    assert bm.admit(seq, [], 1)
    _run(bm, seq, 30)
    full, sliding = list(seq.block_table), list(seq.sliding_table)
    live = [b for b in sliding if b != NO_BLOCK]
    copies = bm.swap_out(seq)
    assert sorted(g for g, _ in copies) == sorted(full + live)
    assert [b == NO_BLOCK for b in seq.cpu_sliding_table] == [b == NO_BLOCK for b in sliding]
    assert bm.gpu.num_free == 64
    back = bm.swap_in(seq)
    assert sorted(c for c, _ in back) == sorted(c for _, c in copies)
    assert [b == NO_BLOCK for b in seq.sliding_table] == [b == NO_BLOCK for b in sliding]
    assert bm.cpu.num_free == 32
    bm.check_invariants([seq])


def test_one_sequence_needs_its_full_blocks_and_a_window_of_sliding_ones():
    bm = BlockManager(64, 0, block_size=16, sliding_window=128)
    assert bm.blocks_to_hold(4096, 512) == 256 + (128 - 1 + 512 + 15) // 16 + 1
    assert BlockManager(64, 0, block_size=16).blocks_to_hold(4096, 512) == 256


def _make(cfg: dict, window: int) -> tuple[Scheduler, BlockManager]:
    config = EngineConfig(model="unused", max_model_len=MAX_LEN, **cfg)
    config.resolve(MAX_LEN)
    bm = BlockManager(config.num_gpu_blocks, config.num_cpu_blocks if config.preemption_mode == "swap" else 0,
                      config.block_size, config.enable_prefix_caching, sliding_window=window)
    need = bm.blocks_to_hold(MAX_LEN, config.max_num_batched_tokens)
    if config.num_gpu_blocks < need:  # what the engine refuses to start with
        bm = BlockManager(need, bm.cpu.num_blocks, config.block_size, config.enable_prefix_caching,
                          sliding_window=window)
    return Scheduler(config, bm), bm


def _step(sched: Scheduler, bm: BlockManager, window: int) -> None:
    out = sched.schedule()
    for item in out.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_new_tokens
        needed = range(max(0, start - window + 1) // bm.block_size, bm.blocks_for(end))  # the first query's window on
        assert len(seq.sliding_table) >= bm.blocks_for(end)
        assert all(seq.sliding_table[i] != NO_BLOCK for i in needed), "a scheduled token's window is not held"
    sched.mark_computed(out)
    for item in out.scheduled:
        if item.sample:
            seq = item.seq
            seq.output_token_ids.append(len(seq.output_token_ids) % 7)
            if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= MAX_LEN:
                seq.finish("length")
                sched.finish(seq)
    bm.check_invariants(sched.live)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=config_st, window=st.sampled_from([1, 5, 8, 20]), ops=st.lists(op_st, min_size=1, max_size=60))
def test_random_add_step_abort_with_a_sliding_window_never_leaks_and_finishes_everything(cfg, window, ops):
    sched, bm = _make(cfg, window)
    ids = itertools.count()
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, plen, max_tokens, prio, base = op
            prompt = [(base + i) % 5 for i in range(min(plen, MAX_LEN - 1))]  # few distinct tokens: prefixes repeat
            seq = Sequence(next(ids), f"r{len(seqs)}", 0, prompt, SamplingParams(max_tokens=max_tokens),
                           float(len(seqs)), priority=prio)
            seqs.append(seq)
            sched.add(seq)
        elif op[0] == "step":
            _step(sched, bm, window)
        else:
            live = [s for s in seqs if not s.is_finished]
            if live:
                sched.abort(live[op[1] % len(live)])
                bm.check_invariants(sched.live)
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        _step(sched, bm, window)
    assert not sched.has_unfinished(), "the scheduler stalled with work left"
    bm.check_invariants([])
    assert bm.gpu.num_free == bm.gpu.num_blocks and bm.cpu.num_free == bm.cpu.num_blocks


def test_a_cache_that_holds_max_model_len_passes_and_one_that_does_not_names_what_fits():
    check_kv_fits(8, 16, 128, 64, None)
    with pytest.raises(ConfigError, match="holds 112 tokens, fewer than max_model_len 128: --max-model-len 112 fits"):
        check_kv_fits(7, 16, 128, 64, None)
    with pytest.raises(ConfigError, match="sliding-window layers' blocks"):
        check_kv_fits(8, 16, 128, 64, 32)
