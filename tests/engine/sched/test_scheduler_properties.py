"""Property tests of the scheduler and block manager, driven without a model: random
add / step / abort sequences never leak blocks, never exceed max_num_seqs or the token budget,
and finish every request that was not aborted."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.engine.sched.block_manager import BlockManager
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.sched.scheduler import Scheduler
from railyard.engine.sched.sequence import Sequence, SequenceStatus

MAX_LEN = 64

config_st = st.fixed_dictionaries({
    "block_size": st.sampled_from([8, 16]),
    "max_num_seqs": st.integers(1, 6),
    "max_num_batched_tokens": st.integers(8, 80),
    "num_gpu_blocks": st.integers(MAX_LEN // 8, 24),
    "preemption_mode": st.sampled_from(["recompute", "swap"]),
    "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
    "enable_prefix_caching": st.booleans(),
    "num_cpu_blocks": st.integers(0, 16),
    "max_prefill_tokens_with_decodes": st.sampled_from([0, 1, 5, 16]),
})
op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 20), st.integers(0, 3), st.integers(0, 5)),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 50)),
)


def _make(cfg: dict) -> tuple[Scheduler, BlockManager]:
    config = EngineConfig(model="unused", max_model_len=MAX_LEN, **cfg)
    config.resolve(MAX_LEN)
    if config.num_gpu_blocks * config.block_size < MAX_LEN:
        config.num_gpu_blocks = -(-MAX_LEN // config.block_size)
    bm = BlockManager(config.num_gpu_blocks, config.num_cpu_blocks if config.preemption_mode == "swap" else 0,
                      config.block_size, config.enable_prefix_caching)
    return Scheduler(config, bm), bm


def _step(sched: Scheduler, bm: BlockManager, budget: int) -> list[Sequence]:
    out = sched.schedule()
    assert out.num_batched_tokens <= budget
    assert len(out.scheduled) <= sched.max_num_seqs
    assert len(sched.running) <= sched.max_num_seqs
    assert len({id(s.seq) for s in out.scheduled}) == len(out.scheduled)
    assert not (out.swap_in and out.swap_out), "swaps in and out never share a step"
    for item in out.scheduled:
        seq = item.seq
        assert item.num_new_tokens >= 1
        assert seq.num_computed_tokens + item.num_new_tokens <= seq.num_tokens
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens + item.num_new_tokens
    sched.mark_computed(out)
    finished = []
    for item in out.scheduled:
        if item.sample:
            seq = item.seq
            seq.output_token_ids.append(len(seq.output_token_ids) % 7)  # any token: no model here
            if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= MAX_LEN:
                seq.finish("length")
                sched.finish(seq)
                finished.append(seq)
    bm.check_invariants(sched.live)
    return finished


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=config_st, ops=st.lists(op_st, min_size=1, max_size=60))
def test_random_add_step_abort_never_leaks_and_finishes_everything(cfg, ops):
    sched, bm = _make(cfg)
    ids = itertools.count()
    seqs: list[Sequence] = []
    aborted: set[int] = set()
    for op in ops:
        if op[0] == "add":
            _, plen, max_tokens, prio, token_base = op
            plen = min(plen, MAX_LEN - 1)
            prompt = [(token_base + i) % 5 for i in range(plen)]  # few distinct tokens: prefixes repeat
            seq = Sequence(next(ids), f"r{len(seqs)}", 0, prompt, SamplingParams(max_tokens=max_tokens),
                           float(len(seqs)), priority=prio)
            seqs.append(seq)
            sched.add(seq)
        elif op[0] == "step":
            _step(sched, bm, cfg["max_num_batched_tokens"])
        else:
            live = [s for s in seqs if not s.is_finished]
            if live:
                victim = live[op[1] % len(live)]
                sched.abort(victim)
                aborted.add(victim.seq_id)
                bm.check_invariants(sched.live)
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        _step(sched, bm, cfg["max_num_batched_tokens"])
    assert not sched.has_unfinished(), "the scheduler stalled with work left"
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED
        assert seq.finish_reason == ("abort" if seq.seq_id in aborted else "length")
        assert not seq.block_table and not seq.cpu_block_table
    bm.check_invariants([])
    assert bm.gpu.num_free == bm.gpu.num_blocks
    assert bm.cpu.num_free == bm.cpu.num_blocks


def _run_to_completion(cfg: dict, prompt_lens: list[int], max_tokens: int) -> Scheduler:
    sched, bm = _make(cfg)
    for i, n in enumerate(prompt_lens):
        sched.add(Sequence(i, f"r{i}", 0, [i % 5] * n, SamplingParams(max_tokens=max_tokens), float(i)))
    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        _step(sched, bm, cfg["max_num_batched_tokens"])
    assert not sched.has_unfinished()
    return sched


def test_pool_too_small_for_the_batch_preempts_by_recompute_and_still_finishes():
    cfg = dict(block_size=8, max_num_seqs=6, max_num_batched_tokens=64, num_gpu_blocks=8,
               preemption_mode="recompute", scheduling_policy="fcfs", enable_prefix_caching=False, num_cpu_blocks=0)
    assert _run_to_completion(cfg, [20] * 6, 20).num_preemptions > 0


def test_pool_too_small_for_the_batch_preempts_by_swap_and_still_finishes():
    cfg = dict(block_size=8, max_num_seqs=6, max_num_batched_tokens=64, num_gpu_blocks=8,
               preemption_mode="swap", scheduling_policy="fcfs", enable_prefix_caching=False, num_cpu_blocks=16)
    sched = _run_to_completion(cfg, [20] * 6, 20)
    assert sched.num_preemptions > 0


def test_priority_policy_admits_lower_priority_value_first():
    sched, bm = _make(dict(block_size=8, max_num_seqs=1, max_num_batched_tokens=64, num_gpu_blocks=16,
                           preemption_mode="recompute", scheduling_policy="priority",
                           enable_prefix_caching=False, num_cpu_blocks=0))
    late_urgent = Sequence(1, "urgent", 0, [1] * 4, SamplingParams(max_tokens=2), 5.0, priority=0)
    early_lazy = Sequence(0, "lazy", 0, [1] * 4, SamplingParams(max_tokens=2), 1.0, priority=3)
    sched.add(early_lazy)
    sched.add(late_urgent)
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["urgent"]


def test_a_step_lists_its_decodes_before_its_prompt_chunks():
    # Priority order puts an urgent prompt, still being chunked, ahead of a running decode; the step lists the
    # decode first all the same (attention runs a mixed step's leading decodes in the decode kernel).
    sched = _roomy(scheduling_policy="priority", long_prefill_token_threshold=10)
    sched.add(Sequence(0, "lazy", 0, [1] * 6, SamplingParams(max_tokens=20), 0.0, priority=3))
    _decode_one_token(sched, sched.schedule())
    sched.add(Sequence(1, "urgent", 0, [2] * 30, SamplingParams(max_tokens=1), 1.0, priority=0))
    first = sched.schedule()
    _decode_one_token(sched, first)
    assert [seq.request_id for seq in sched.running] == ["urgent", "lazy"]
    second = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("lazy", 1), ("urgent", 10)]
    assert [(s.seq.request_id, s.num_new_tokens) for s in second.scheduled] == [("lazy", 1), ("urgent", 10)]


def test_chunked_prefill_splits_a_long_prompt_over_steps_within_budget():
    sched, bm = _make(dict(block_size=8, max_num_seqs=2, max_num_batched_tokens=16, num_gpu_blocks=16,
                           preemption_mode="recompute", scheduling_policy="fcfs",
                           enable_prefix_caching=False, num_cpu_blocks=0))
    sched.add(Sequence(0, "long", 0, [3] * 40, SamplingParams(max_tokens=1), 0.0))
    chunks = []
    while sched.has_unfinished():
        out = sched.schedule()
        chunks.append([(s.num_new_tokens, s.sample) for s in out.scheduled])
        sched.mark_computed(out)
        for item in out.scheduled:
            if item.sample:
                item.seq.output_token_ids.append(0)
                item.seq.finish("length")
                sched.finish(item.seq)
    assert chunks == [[(16, False)], [(16, False)], [(8, True)]]


def _roomy(**options) -> Scheduler:
    """A scheduler with room for everything (4 seats, 64-token budget, 32 blocks of 8), FCFS unless options say."""
    sched, _ = _make(dict(dict(block_size=8, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks=32,
                               preemption_mode="recompute", scheduling_policy="fcfs", enable_prefix_caching=False,
                               num_cpu_blocks=0), **options))
    return sched


def test_long_prefill_token_threshold_caps_each_prompts_chunk_and_the_budget_takes_several():
    sched = _roomy(long_prefill_token_threshold=12)
    sched.add(Sequence(0, "a", 0, [3] * 30, SamplingParams(max_tokens=1), 0.0))
    sched.add(Sequence(1, "b", 0, [4] * 20, SamplingParams(max_tokens=1), 1.0))
    first = sched.schedule()
    # Neither prompt takes more than 12 tokens of the step, and both start in it (the budget holds 64).
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("a", 12), ("b", 12)]
    sched.mark_computed(first)
    second = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.sample) for s in second.scheduled] == \
        [("a", 12, False), ("b", 8, True)]


def _decode_one_token(sched: Scheduler, out) -> None:
    """What the engine does after a step: computed counts advance, each sampled row gets its token."""
    sched.mark_computed(out)
    for item in out.scheduled:
        if item.sample:
            item.seq.output_token_ids.append(0)


def test_prefill_tokens_with_decodes_cap_the_prompt_tokens_of_steps_that_carry_decodes_only():
    sched = _roomy(max_prefill_tokens_with_decodes=10)
    sched.add(Sequence(0, "a", 0, [3] * 6, SamplingParams(max_tokens=20), 0.0))
    sched.add(Sequence(1, "b", 0, [4] * 7, SamplingParams(max_tokens=20), 1.0))
    first = sched.schedule()  # nothing decodes yet: the whole budget is prompt tokens
    assert [(s.seq.request_id, s.num_new_tokens) for s in first.scheduled] == [("a", 6), ("b", 7)]
    _decode_one_token(sched, first)
    sched.add(Sequence(2, "c", 0, [5] * 30, SamplingParams(max_tokens=1), 2.0))
    sched.add(Sequence(3, "d", 0, [6] * 30, SamplingParams(max_tokens=1), 3.0))
    steps = []
    for _ in range(4):
        out = sched.schedule()
        steps.append([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled])
        _decode_one_token(sched, out)
    # a and b decode every step; c's and d's prompts share 10 prompt tokens a step, c first (FCFS); once c's
    # prompt is done it decodes too.
    assert steps == [[("a", 1), ("b", 1), ("c", 10)],
                     [("a", 1), ("b", 1), ("c", 10)],
                     [("a", 1), ("b", 1), ("c", 10)],
                     [("a", 1), ("b", 1), ("c", 1), ("d", 10)]]


def test_capped_prefill_chunks_give_the_same_tokens(tiny_model):
    from railyard import LLM

    prompts = [[(7 * i + j) % 250 for j in range(n)] for i, n in enumerate((5, 40, 90, 13))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(tiny_model, block_size=8).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    capped = LLM(tiny_model, block_size=8, long_prefill_token_threshold=16).generate(
        prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in capped] == [o.outputs[0].token_ids for o in plain]
    mixed = LLM(tiny_model, block_size=8, max_prefill_tokens_with_decodes=8).generate(
        prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed] == [o.outputs[0].token_ids for o in plain]
