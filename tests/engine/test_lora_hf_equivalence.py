"""Requests of three different LoRA adapters and of the base model, mixed in one batch, must give HF transformers +
peft's greedy tokens for each, whatever the engine does underneath: chunked prefill, preemption (recompute and swap),
fewer device slots than adapters, prefix caching (never shared across adapters)."""

from __future__ import annotations

import random

import pytest

from railyard import LLM, LoRARequest, SamplingParams
from tests.engine.lora.adapters import ADAPTERS, peft_greedy, write_adapter

MAX_NEW = 16
ARCHS = ("qwen2", "qwen3", "llama")
_rng = random.Random(4321)
_shared = [_rng.randrange(256) for _ in range(24)]
# Each adapter (and the base model) gets a prompt of its own and the same shared-prefix prompt: a prefix cache that
# served one adapter's KV to another would change the latter's tokens.
_own = [[_rng.randrange(256) for _ in range(n)] for n in (5, 19, 33, 11)]
NAMES = [*ADAPTERS, None]
PROMPTS = [p for p in _own] + [_shared + [7, 8, 9]] * len(NAMES)
OWNERS = NAMES + NAMES  # the adapter of each prompt (None: the base model)

VARIANTS = {
    "prefix-cache-bs8": dict(block_size=8),
    "chunked-prefill": dict(block_size=8, max_num_batched_tokens=16),
    "preempt-recompute": dict(block_size=8, num_gpu_blocks=14, max_model_len=64, preemption_mode="recompute"),
    "preempt-swap": dict(block_size=8, num_gpu_blocks=14, max_model_len=64, preemption_mode="swap",
                         num_cpu_blocks=64),
    "two-slots-for-three-adapters": dict(block_size=8, max_loras=2),
}


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> dict[str, dict[str, str]]:
    """{arch: {adapter name: directory}}, written by peft for each tiny checkpoint."""
    root = tmp_path_factory.mktemp("lora-adapters")
    return {arch: {name: write_adapter(tiny_models[arch], root / arch / name, seed=i, **cfg)
                   for i, (name, cfg) in enumerate(ADAPTERS.items())}
            for arch in ARCHS}


@pytest.fixture(scope="module")
def expected(tiny_models, adapters) -> dict[str, list[list[int]]]:
    """Per architecture, HF + peft's greedy tokens of each prompt under its owner."""
    out = {}
    for arch in ARCHS:
        path = tiny_models[arch]
        out[arch] = [peft_greedy(path, adapters[arch][owner] if owner else None, [prompt], MAX_NEW)[0]
                     for prompt, owner in zip(PROMPTS, OWNERS)]
    return out


def _requests(adapters: dict[str, str]) -> list[LoRARequest | None]:
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    return [LoRARequest(owner, ids[owner], adapters[owner]) if owner else None for owner in OWNERS]


def test_every_adapter_changes_the_output(expected):
    base = expected["qwen2"][NAMES.index(None) + len(NAMES)]
    shared = expected["qwen2"][len(NAMES):]
    assert all(tokens != base for tokens in shared[:-1]), "an adapter left the base model's tokens unchanged"


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_adapter_batch_matches_hf_peft(tiny_models, adapters, expected, arch, variant):
    config = dict(enable_lora=True, max_loras=3, max_lora_rank=16, max_model_len=128) | VARIANTS[variant]
    llm = LLM(tiny_models[arch], **config)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    loras = _requests(adapters[arch])
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outputs] == expected[arch]
    stats = llm.engine.stats()
    if variant.startswith("preempt"):
        assert stats.num_preemptions_total > 0, "the KV pool was meant to be too small for the batch"
    if variant == "two-slots-for-three-adapters":
        assert stats.num_lora_loads_total > config["max_loras"], "three adapters through two slots evict one"
    # Again, from cached prefix blocks (each adapter's own): still identical.
    again = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in again] == expected[arch]
    if not variant.startswith("preempt"):  # (a pool that small keeps no prefix blocks between the two calls)
        assert llm.engine.stats().prefix_cache_hits > stats.prefix_cache_hits
    llm.engine.check_invariants()


def test_attention_adapters_on_a_mixture_of_experts_model_match_hf_peft(tiny_models, tmp_path):
    model = tiny_models["qwen3moe"]
    path = write_adapter(model, tmp_path / "attn", r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                         "o_proj"])
    prompts = _own[:3]
    llm = LLM(model, enable_lora=True, max_model_len=128, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    lora = LoRARequest("attn", 1, path)
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False,
                           lora_request=[lora, None, lora])
    assert [o.outputs[0].token_ids for o in outputs] == [
        peft_greedy(model, path if i != 1 else None, [p], MAX_NEW)[0] for i, p in enumerate(prompts)]
