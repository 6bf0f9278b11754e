"""Prefix caching is real: a second batch sharing a long prefix hits the cache and computes less."""

from __future__ import annotations

import random

from railyard import LLM, SamplingParams


def _batch(prefix: list[int], rng: random.Random, n: int = 4) -> list[list[int]]:
    return [prefix + [rng.randrange(256) for _ in range(6)] for _ in range(n)]


def test_second_batch_with_shared_prefix_hits_cache_and_computes_fewer_tokens(tiny_model):
    rng = random.Random(7)
    prefix = [rng.randrange(256) for _ in range(96)]  # six full 16-token blocks
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = LLM(tiny_model, block_size=16)

    llm.generate(prompt_token_ids=[prefix + [1, 2, 3]], sampling_params=params, use_tqdm=False)
    before = llm.engine.stats()
    batch = _batch(prefix, rng)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False)
    after = llm.engine.stats()

    hits = after.prefix_cache_hits - before.prefix_cache_hits
    assert hits == 4 * 96, "every prompt of the second batch reuses all six cached prefix blocks"
    computed = after.computed_tokens_total - before.computed_tokens_total
    prompt_tokens = sum(len(p) for p in batch)
    assert computed <= prompt_tokens - hits + 4 * params.max_tokens
    assert all(o.metrics.num_cached_prompt_tokens == 96 for o in outs)

    cold = LLM(tiny_model, block_size=16, enable_prefix_caching=False)
    cold_outs = cold.generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in cold_outs]
    assert cold.engine.stats().prefix_cache_hits == 0
    assert cold.engine.stats().computed_tokens_total > computed


def test_unreferenced_cached_blocks_are_evicted_lru_when_the_pool_is_full(tiny_model):
    llm = LLM(tiny_model, block_size=8, num_gpu_blocks=130, max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    rng = random.Random(3)
    for _ in range(6):  # more distinct 100-token prompts than the pool can keep cached
        llm.generate(prompt_token_ids=[[rng.randrange(256) for _ in range(100)]], sampling_params=params,
                     use_tqdm=False)
    llm.engine.check_invariants()
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert len(llm.engine.cached_block_hashes()) <= stats.num_total_blocks
