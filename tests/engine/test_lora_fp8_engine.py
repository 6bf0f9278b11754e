"""LoRA adapters on FP8 weights through the engine. Oracles: base-model requests beside adapter requests get the
tokens of the same FP8 model serving no adapters; an adapter's requests get the tokens they get alone, however the
batch is mixed, chunked or preempted. (How close an adapter on FP8 weights stays to the same adapter on the
unquantized model: tests/bench/test_fp8_lora_accuracy.py.)"""

from __future__ import annotations

import random

import pytest

from railyard import LLM, LoRARequest, SamplingParams
from tests.engine.lora.adapters import ADAPTERS, write_adapter

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
_rng = random.Random(99)
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (6, 21, 35, 13, 28, 9)]
FP8 = dict(device="cpu", quantization="fp8", block_size=8, max_model_len=96)
VARIANTS = {
    "chunked-prefill": dict(max_num_batched_tokens=16),
    "preempt-swap": dict(num_gpu_blocks=14, preemption_mode="swap", num_cpu_blocks=64),
    "one-slot-for-two-adapters": dict(max_loras=1),
}


@pytest.fixture(scope="module")
def loras(tiny_model, tmp_path_factory) -> list[LoRARequest | None]:
    """An owner per prompt: two adapters of different targets and ranks, and the base model (None)."""
    root = tmp_path_factory.mktemp("fp8-adapters")
    a, b = (LoRARequest(name, i + 1, write_adapter(tiny_model, root / name, seed=i, **ADAPTERS[name]))
            for i, name in enumerate(("attn-r8", "mlp-r16")))
    return [a, None, b, a, None, b]


def _generate(llm: LLM, prompts, loras) -> list[list[int]]:
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False, lora_request=loras)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def alone(tiny_model, loras) -> list[list[int]]:
    """Each prompt on its own, under its owner, on an FP8 engine serving adapters."""
    llm = LLM(tiny_model, enable_lora=True, max_loras=2, **FP8)
    return [_generate(llm, [p], [owner])[0] for p, owner in zip(PROMPTS, loras)]


def test_base_requests_beside_adapters_get_the_fp8_models_own_tokens(tiny_model, loras, alone):
    without_lora = _generate(LLM(tiny_model, **FP8), PROMPTS, None)
    mixed = _generate(LLM(tiny_model, enable_lora=True, max_loras=2, **FP8), PROMPTS, loras)
    assert mixed == alone
    for tokens, base, owner in zip(mixed, without_lora, loras):
        assert (tokens == base) == (owner is None), "base requests keep the FP8 model's tokens; adapters change theirs"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mixed_chunked_or_preempted_batches_keep_each_requests_tokens(tiny_model, loras, alone, variant):
    llm = LLM(tiny_model, **(dict(enable_lora=True, max_loras=2, **FP8) | VARIANTS[variant]))
    assert _generate(llm, PROMPTS, loras) == alone
    stats = llm.engine.stats()
    if variant == "preempt-swap":
        assert stats.num_preemptions_total > 0, "the KV pool was meant to be too small for the batch"
    if variant == "one-slot-for-two-adapters":
        assert stats.num_lora_loads_total >= 2, "both adapters took turns in the one slot"
