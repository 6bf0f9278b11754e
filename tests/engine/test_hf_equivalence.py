"""Greedy output must be token-identical to HF transformers `generate` on the same checkpoint,
whatever the engine does underneath: prefix caching, block sizes, chunked prefill, preemption."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from railyard import LLM, SamplingParams
from railyard.model.spec import ModelSpec
from tests.engine.hf_oracle import hf_greedy

MAX_NEW = 20
_rng = random.Random(1234)
_shared = [_rng.randrange(256) for _ in range(40)]
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (3, 17, 33, 64, 70, 9)]
PROMPTS += [_shared + [_rng.randrange(256) for _ in range(n)] for n in (5, 12)]  # shared 40-token prefix

VARIANTS = {
    "prefix-cache-on-bs16": dict(block_size=16, enable_prefix_caching=True),
    "prefix-cache-off-bs8": dict(block_size=8, enable_prefix_caching=False),
    "chunked-prefill": dict(block_size=8, max_num_batched_tokens=16),
    "preempt-recompute": dict(block_size=8, num_gpu_blocks=20, max_model_len=128, preemption_mode="recompute"),
    "preempt-swap": dict(block_size=8, num_gpu_blocks=20, max_model_len=128, preemption_mode="swap",
                         num_cpu_blocks=64),
}


@pytest.fixture(scope="module")
def expected(tiny_models):
    return {arch: hf_greedy(path, PROMPTS, MAX_NEW) for arch, path in tiny_models.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama", "qwen3moe"])
def test_greedy_matches_hf_generate(tiny_models, expected, arch, variant):
    llm = LLM(tiny_models[arch], **VARIANTS[variant])
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == expected[arch]
    stats = llm.engine.stats()
    if variant.startswith("preempt"):
        assert stats.num_preemptions_total > 0, "the KV pool was meant to be too small for the batch"
    if llm.engine.config.enable_prefix_caching:
        # Again, now computing from cached prefix blocks: still identical.
        again = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in again] == expected[arch]
        assert llm.engine.stats().prefix_cache_hits > stats.prefix_cache_hits
    llm.engine.check_invariants()
    assert llm.engine.stats().num_free_blocks == llm.engine.stats().num_total_blocks  # cached blocks are reclaimable


def test_sharded_checkpoint_loads_like_single_file(tmp_path, tiny_models):
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint

    sharded = write_tiny_checkpoint(tmp_path / "sharded", "qwen2", num_shards=3)
    assert (sharded / "model.safetensors.index.json").is_file()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    a = LLM(str(sharded)).generate(prompt_token_ids=PROMPTS[:3], sampling_params=params, use_tqdm=False)
    b = LLM(tiny_models["qwen2"]).generate(prompt_token_ids=PROMPTS[:3], sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_attention_bias_puts_a_bias_on_q_k_v_and_o_as_hf_does(tmp_path, arch):
    """Llama and Qwen3 configs with attention_bias: true carry biases on all four attention projections."""
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint

    path = str(write_tiny_checkpoint(tmp_path / arch, arch, attention_bias=True))
    spec = ModelSpec.from_hf_config(json.loads((Path(path) / "config.json").read_text()))
    assert spec.attention_bias and spec.o_proj_bias
    llm = LLM(path)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS[:4], sampling_params=params,
                                                         use_tqdm=False)]
    assert got == hf_greedy(path, PROMPTS[:4], MAX_NEW)
