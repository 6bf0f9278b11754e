"""LoRA through both graph paths: the adapter slot of every token is a device buffer the host fills before a replay,
and the tokens are grouped by slot on the device inside the graph, so one captured graph serves any mix of adapters.

On the CPU the piecewise split runs eagerly through its static buffers and padding (capture=False), with steps that
mix prefill chunks and decodes of several adapters and the base model; on a GPU the captured decode graphs and
pieces run, and greedy tokens are HF transformers + peft's either way."""

from __future__ import annotations

import random

import pytest
import torch

from railyard import LLM, LoRARequest, SamplingParams
from railyard.engine.runner.piecewise_graphs import PiecewiseGraphs
from tests.engine.lora.adapters import ADAPTERS, peft_greedy, write_adapter

PROMPTS = [[random.Random(n).randrange(256) for _ in range(n)] for n in (3, 17, 33, 9, 21, 5)]
NAMES = [*ADAPTERS, None, *ADAPTERS][:len(PROMPTS)]
MAX_NEW = 12


@pytest.fixture(scope="module")
def case(tiny_models, tmp_path_factory):
    """(model, LoRA request per prompt, HF + peft's tokens per prompt) for the tiny qwen2 and llama."""
    root = tmp_path_factory.mktemp("graph-lora")
    out = {}
    for arch in ("qwen2", "llama"):
        model = tiny_models[arch]
        dirs = {n: write_adapter(model, root / arch / n, seed=i, **cfg) for i, (n, cfg) in enumerate(ADAPTERS.items())}
        ids = {n: i + 1 for i, n in enumerate(ADAPTERS)}
        loras = [LoRARequest(n, ids[n], dirs[n]) if n else None for n in NAMES]
        expected = [peft_greedy(model, dirs[n] if n else None, [p], MAX_NEW)[0] for n, p in zip(NAMES, PROMPTS)]
        out[arch] = (model, loras, expected)
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_mixed_adapters_through_the_pieces_match_hf_peft(case, arch):
    model, loras, expected = case[arch]
    llm = LLM(model, device="cpu", block_size=8, max_num_batched_tokens=24, enable_lora=True, max_loras=3)
    runner = llm.engine.executor.runner
    runner.piecewise = PiecewiseGraphs(runner.model, 24, runner.device, capture=False)
    calls = []
    run = runner.piecewise.run
    runner.piecewise.run = lambda *a, **k: calls.append(len(a[0])) or run(*a, **k)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert any(n > len(PROMPTS) for n in calls), "no step carried a prefill chunk through the pieces"
    assert any(n not in runner.piecewise.sizes for n in calls), "no step was padded to a bucket"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_mixed_adapters_through_captured_decode_graphs_and_pieces_match_hf_peft_on_gpu(case, arch):
    model, loras, expected = case[arch]
    llm = LLM(model, device="cuda", dtype="float32", attention_backend="triton", block_size=8,
              max_num_batched_tokens=24, enable_lora=True, max_loras=3)
    runner = llm.engine.executor.runner
    assert runner.graphs is not None and runner.piecewise is not None and runner.piecewise.graphs
    replays = []
    run = runner.graphs.run
    runner.graphs.run = lambda *a, **k: replays.append(len(a[0])) or run(*a, **k)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False, lora_request=loras)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert replays, "no decode step replayed a captured graph"
