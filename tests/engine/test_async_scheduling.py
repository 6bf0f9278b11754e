"""Asynchronous scheduling (step N+1 planned while step N runs, its decode inputs fed on the device) must
change nothing a user sees: the same tokens, texts, logprobs and finish reasons as one step at a time,
through preemption, swapping, prefix caching, chunked prefill, aborts and every sampling option."""

from __future__ import annotations

import random

import pytest

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from tests.engine.recording_executor import RecordingExecutor

_rng = random.Random(7)
_shared = [_rng.randrange(256) for _ in range(24)]
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (3, 17, 33, 50, 9, 70)]
PROMPTS += [_shared + [_rng.randrange(256) for _ in range(n)] for n in (5, 12, 30)]

SCENARIOS = {
    "prefix-cache": dict(block_size=8, enable_prefix_caching=True),
    "chunked-prefill": dict(block_size=8, max_num_batched_tokens=16),
    "preempt-recompute": dict(block_size=8, num_gpu_blocks=24, max_model_len=128, preemption_mode="recompute"),
    "preempt-swap": dict(block_size=8, num_gpu_blocks=24, max_model_len=128, preemption_mode="swap",
                         num_cpu_blocks=64),
    "few-seats": dict(block_size=16, max_num_seqs=3),
    "max-model-len": dict(block_size=8, max_model_len=80),
}


def _params(i: int) -> SamplingParams:
    """A mix of what users send: greedy, seeded sampling, stops, logprobs, n > 1, min_tokens, penalties."""
    kinds = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[7, 19, 101, 200]),
        SamplingParams(temperature=0.0, max_tokens=30, stop=["e", "a"]),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.0, min_tokens=6, max_tokens=18),
        SamplingParams(temperature=0.0, max_tokens=None),  # until EOS or max_model_len
    ]
    return kinds[i % len(kinds)]


def _run(model: str, async_scheduling: bool, with_penalty: bool = False, **cfg) -> tuple[dict, Engine]:
    cfg.setdefault("max_model_len", 128)  # bounds the requests that run until EOS
    engine = Engine(EngineConfig(model=model, device="cpu", async_scheduling=async_scheduling, **cfg))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", None, _params(i), prompt_token_ids=prompt)
    if with_penalty:
        engine.add_request("pen", None, SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=20,
                                                       ignore_eos=True), prompt_token_ids=PROMPTS[0])
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert all(t >= 0 for c in out.outputs for t in c.token_ids), "a placeholder leaked into an output"
            if out.finished:
                final[out.request_id] = [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs)
                                         for c in out.outputs]
    engine.check_invariants()
    return final, engine


def _assert_same(got: dict, expected: dict) -> None:
    """Tokens, texts and reasons exactly; logprobs to float32 rounding (batches are shaped differently,
    so CPU matmuls may round differently in the last bit)."""
    assert got.keys() == expected.keys()
    for rid in got:
        for (*a, a_lp), (*b, b_lp) in zip(got[rid], expected[rid], strict=True):
            assert a == b, rid
            assert (a_lp is None) == (b_lp is None)
            for x, y in zip(a_lp or [], b_lp or [], strict=True):
                assert x.keys() == y.keys() and all(abs(x[k] - y[k]) < 1e-4 for k in x), rid


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_async_scheduling_gives_exactly_the_synchronous_outputs(tiny_model, scenario):
    cfg = dict(SCENARIOS[scenario])
    sync, sync_engine = _run(tiny_model, False, **cfg)
    got, engine = _run(tiny_model, True, **cfg)
    assert engine.async_scheduling and not sync_engine.async_scheduling
    assert len(got) == len(PROMPTS)
    _assert_same(got, sync)
    if scenario.startswith("preempt"):
        assert engine.stats().num_preemptions_total > 0, "the KV pool was meant to be too small"
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_a_penalty_request_makes_steps_wait_and_changes_nothing(tiny_model):
    sync, _ = _run(tiny_model, False, with_penalty=True, block_size=8)
    got, _ = _run(tiny_model, True, with_penalty=True, block_size=8)
    _assert_same(got, sync)
    assert "pen" in got


def test_the_next_step_is_launched_before_the_last_one_is_waited_for(tiny_model):
    engine = Engine(EngineConfig(model=tiny_model, device="cpu"))
    events: list[str] = []
    engine.core.executor = RecordingExecutor(engine.executor, events)
    engine.add_request("a", None, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                       prompt_token_ids=PROMPTS[1])
    while engine.has_unfinished_requests():
        engine.step()
    # launch 1, then every later launch comes before the wait for the step before it
    assert events[:3] == ["launch", "launch", "wait"]
    assert events.count("launch") == 5  # the prefill step and 4 decodes: no wasted step at max_tokens
    assert events.count("wait") == 5


def test_length_capped_sequences_get_no_wasted_rows(tiny_model):
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    computed = []
    for mode in (False, True):
        engine = Engine(EngineConfig(model=tiny_model, device="cpu", async_scheduling=mode))
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", None, params, prompt_token_ids=prompt)
        while engine.has_unfinished_requests():
            engine.step()
        computed.append(engine.stats().computed_tokens_total)
    assert computed[0] == computed[1] == sum(len(p) for p in PROMPTS) + len(PROMPTS) * 8


def test_abort_while_its_step_is_in_flight(tiny_model):
    engine = Engine(EngineConfig(model=tiny_model, device="cpu", block_size=8))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add_request(f"r{i}", None, params, prompt_token_ids=prompt)
    engine.step()
    engine.step()  # r0..r3 each have a token in flight now
    assert engine.abort("r1") and engine.abort("r2")
    engine.check_invariants()
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id not in ("r1", "r2")
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
    engine.check_invariants()
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    alone = Engine(EngineConfig(model=tiny_model, device="cpu", block_size=8, async_scheduling=False))
    for rid in ("r0", "r3"):
        alone.add_request(rid, None, params, prompt_token_ids=PROMPTS[int(rid[1])])
    expected = {}
    while alone.has_unfinished_requests():
        for out in alone.step():
            if out.finished:
                expected[out.request_id] = out.outputs[0].token_ids
    assert final == expected
