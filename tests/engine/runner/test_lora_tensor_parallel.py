"""LoRA under tensor parallelism on CPU (gloo): adapters shard like their base layers (column-parallel: A whole, B
split by output rows, q/k/v and gate/up each in their own part; row-parallel: A split by input columns, B whole,
added before the all-reduce), and a batch mixing adapters and the base model gives HF transformers + peft's tokens
on every rank count, with KV heads split and replicated, through swap preemption."""

from __future__ import annotations

import pytest

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.lora.request import LoRARequest
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from tests.engine.lora.adapters import ADAPTERS, peft_greedy, write_adapter

MAX_NEW = 12
PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 9, 17, 33, 40, 25, 12, 30)]
NAMES = [*ADAPTERS, None] * 2
ENGINE = dict(device="cpu", block_size=8, num_gpu_blocks=12, max_model_len=64, preemption_mode="swap",
              num_cpu_blocks=64, enable_lora=True, max_loras=3, max_lora_rank=16)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-lora")
    model = str(write_tiny_checkpoint(root / "qwen2", "qwen2", num_key_value_heads=2))
    dirs = {name: write_adapter(model, root / name, seed=i, **cfg) for i, (name, cfg) in enumerate(ADAPTERS.items())}
    loras = [LoRARequest(n, list(ADAPTERS).index(n) + 1, dirs[n]) if n else None for n in NAMES]
    expected = [peft_greedy(model, dirs[n] if n else None, [p], MAX_NEW)[0] for n, p in zip(NAMES, PROMPTS)]
    return model, loras, expected


@pytest.mark.parametrize("tp", [2, 4], ids=["kv-heads-split-tp2", "kv-heads-replicated-tp4"])
def test_mixed_adapter_batch_matches_hf_peft_under_tensor_parallelism(setup, tp):
    model, loras, expected = setup
    llm = LLM(model, tensor_parallel_size=tp, **ENGINE)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False, lora_request=loras)
        assert [o.outputs[0].token_ids for o in outs] == expected
        stats = llm.engine.stats()
        assert stats.num_preemptions_total > 0, "the KV pool was meant to be too small for the batch"
    finally:
        llm.engine.shutdown()
