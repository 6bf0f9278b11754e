"""An eager step's rows are padded up to one of a finite set of buckets, so the library GEMMs meet only row counts
the start-up warm-up ran; the padding changes no real row, writes no KV, and costs at most 1/PER_OCTAVE of a step.

Oracles: every row count in a range against the bucket list (brute force); the same step unpadded, for the hidden
states and the KV cache; HF transformers for the tokens of an engine whose steps are all eager and padded."""

from __future__ import annotations

import random

import pytest
import torch

from railyard import LLM, SamplingParams
from railyard.engine.runner.row_buckets import PER_OCTAVE, row_bucket, row_buckets
from tests.engine.hf_oracle import hf_greedy
from tests.engine.runner.step_plans import filled_caches, small_runner, step_plan


@pytest.mark.parametrize("lo, hi", [(1, 300), (2049, 16384), (2049, 10000), (1, 1), (7, 7), (9, 3)])
def test_every_row_count_pads_to_a_listed_bucket_no_further_than_a_32nd_of_it(lo, hi):
    buckets = row_buckets(lo, hi)
    assert buckets == sorted(set(buckets))
    for n in range(lo, hi + 1):
        b = row_bucket(n, hi)
        assert b in buckets and n <= b <= hi
        assert (b - n) * PER_OCTAVE <= b, (n, b)
    if hi >= lo:
        assert buckets[-1] == hi  # the largest step the limits allow is a bucket of its own


def test_the_buckets_are_few_per_octave():
    assert len(row_buckets(2049, 16384)) == 3 * PER_OCTAVE
    assert row_bucket(16384, 16384) == 16384 and row_bucket(7876, 16384) == 7936
    assert [row_bucket(n) for n in (1, 63, 64, 65, 100)] == [1, 63, 64, 66, 100]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen3moe"])
def test_padding_rows_change_no_real_row_and_write_no_kv(tiny_models, arch):
    runner = small_runner(tiny_models[arch], "cpu")
    plan = step_plan(runner, [(5, 1), (0, 40), (9, 23), (17, 1)], random.Random(arch))  # 65 tokens
    meta = runner.to_metadata(plan)
    caches = filled_caches(runner)
    n, padded = len(plan.input_ids), 80
    results = []
    with torch.inference_mode():
        for rows in (n, padded):
            own = [c.clone() for c in caches]
            ids = torch.tensor(plan.input_ids + [0] * (rows - n))
            pos = torch.tensor(plan.positions + [0] * (rows - n))
            hidden = runner.model(ids, pos, own, meta, num_tokens=n)
            assert hidden.shape[0] == rows
            results.append((hidden[:n], own))
    (ref, ref_caches), (got, got_caches) = results
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_caches, ref_caches):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


PROMPTS = [[random.Random(n).randrange(256) for _ in range(n)] for n in (70, 3, 97, 33)]


def test_an_engine_of_padded_eager_steps_matches_hf_generate(tiny_models):
    # On the CPU every step runs eagerly: the prefill steps (up to 203 tokens) and the LM head's 4 sampled rows
    # are padded to their buckets.
    llm = LLM(tiny_models["qwen2"], device="cpu", block_size=8, max_num_batched_tokens=256)
    runner = llm.engine.executor.runner
    seen = []
    forward = runner.model.forward
    runner.model.forward = lambda ids, *a, **k: seen.append((ids.shape[0], k.get("num_tokens"))) or forward(ids, *a, **k)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(tiny_models["qwen2"], PROMPTS, 8)
    assert any(rows > n for rows, n in seen), f"no step was padded: {seen}"
    assert all(rows == row_bucket(n, 256) for rows, n in seen)
