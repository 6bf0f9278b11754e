"""gpt-oss (GptOssForCausalLM): greedy tokens equal HF transformers `generate` on tiny random checkpoints, with float32
experts and with MXFP4 experts as the real checkpoints ship them (HF widens those as it loads; railyard keeps the
bytes), through every engine path the HF-equality tests cover: prefix-cache hits, chunked prefill, recompute and swap
preemption, asynchronous scheduling, the piecewise pieces (eager on the CPU), tensor parallel on CPU. Prompts run
past the 16-token sliding window, whose layers keep only the blocks it sees."""

from __future__ import annotations

import pytest
import torch

from railyard import LLM, SamplingParams
from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.engine.runner.piecewise_graphs import PiecewiseGraphs
from railyard.engine.sched.block_manager import NO_BLOCK
from tests.engine.gpt_oss_checkpoint import WINDOW, write_tiny_gpt_oss
from tests.engine.hf_oracle import hf_greedy
from tests.engine.test_hf_equivalence import MAX_NEW, PROMPTS, VARIANTS

assert max(map(len, PROMPTS)) > 4 * WINDOW
# A pool too small for the batch, yet enough for one sequence with its window's sliding blocks.
GPT_OSS_VARIANTS = {**VARIANTS,
                    "preempt-recompute": dict(VARIANTS["preempt-recompute"], num_gpu_blocks=36,
                                              max_num_batched_tokens=64),
                    "preempt-swap": dict(VARIANTS["preempt-swap"], num_gpu_blocks=36, max_num_batched_tokens=64)}
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
pytestmark = pytest.mark.slow  # long generations of a 4-layer MoE model on the CPU, tensor-parallel workers


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("gpt-oss")
    return {"float32": str(write_tiny_gpt_oss(root / "float32")),
            "mxfp4": str(write_tiny_gpt_oss(root / "mxfp4", mxfp4=True))}


@pytest.fixture(scope="module")
def expected(checkpoints) -> dict[str, list[list[int]]]:
    return {kind: hf_greedy(path, PROMPTS, MAX_NEW) for kind, path in checkpoints.items()}


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                          use_tqdm=False)]


@pytest.mark.parametrize("variant", list(GPT_OSS_VARIANTS))
@pytest.mark.parametrize("kind", ["float32", "mxfp4"])
def test_greedy_matches_hf_generate(checkpoints, expected, kind, variant):
    llm = LLM(checkpoints[kind], **GPT_OSS_VARIANTS[variant])
    assert _tokens(llm) == expected[kind]
    stats = llm.engine.stats()
    if variant.startswith("preempt"):
        assert stats.num_preemptions_total > 0, "the KV pool was meant to be too small for the batch"
    if llm.engine.config.enable_prefix_caching:  # again, from cached prefix blocks (full and sliding); a small
        # pool keeps only the last prompts' blocks (a hit needs the window's sliding blocks too): those run again
        again = slice(-2, None) if variant.startswith("preempt") else slice(None)
        assert _tokens(llm, PROMPTS[again]) == expected[kind][again]
        assert llm.engine.stats().prefix_cache_hits > stats.prefix_cache_hits
    llm.engine.check_invariants()
    assert llm.engine.stats().num_free_blocks == llm.engine.stats().num_total_blocks


def test_mxfp4_experts_stay_mxfp4_in_memory(checkpoints):
    runner = LLM(checkpoints["mxfp4"]).engine.executor.runner
    experts = runner.model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == experts.w2_weight.dtype == experts.w13_weight_scale.dtype == torch.uint8
    # 4 bits a weight: half a byte, as the checkpoint holds them
    assert experts.w13_weight.shape[-1] * 2 == runner.spec.hidden_size


def test_sliding_layers_hold_only_the_blocks_their_window_sees(checkpoints):
    """Once decoding (the prompt's chunk wrote every token's sliding KV; the next step's allocation frees what the
    window has passed), a sequence holds full-attention blocks for every token and a window of sliding ones."""
    engine = Engine(EngineConfig(model=checkpoints["float32"], device="cpu", block_size=8, enable_prefix_caching=False))
    engine.add_request("long", None, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                       prompt_token_ids=PROMPTS[4])  # 70 tokens, 110 at the end
    window_blocks = -(-(WINDOW - 1) // 8) + 1  # those the next token's window sees, its own block included
    decoding = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            if len(seq.output_token_ids) > 1:
                decoding += 1
                assert sum(b != NO_BLOCK for b in seq.sliding_table) <= window_blocks
                assert engine.block_manager.num_used_blocks <= len(seq.block_table) + window_blocks
    assert decoding > 30
    engine.shutdown()


def test_asynchronous_scheduling_gives_hf_tokens(checkpoints, expected):
    llm = LLM(checkpoints["mxfp4"], block_size=8, max_num_batched_tokens=24, async_scheduling=True)
    assert llm.engine.async_scheduling
    assert _tokens(llm) == expected["mxfp4"]


def test_engine_through_the_pieces_matches_hf_generate(checkpoints, expected):
    llm = LLM(checkpoints["float32"], device="cpu", block_size=8, max_num_batched_tokens=24)
    runner = llm.engine.executor.runner
    runner.piecewise = PiecewiseGraphs(runner.model, 24, runner.device, capture=False)
    calls = []
    run = runner.piecewise.run
    runner.piecewise.run = lambda *a, **k: calls.append(len(a[0])) or run(*a, **k)
    assert _tokens(llm) == expected["float32"]
    assert any(n > 1 for n in calls), "no step ran through the pieces"


@pytest.mark.parametrize("kind", ["float32", "mxfp4"])
def test_tensor_parallel_on_cpu_gives_hf_tokens(checkpoints, expected, kind):
    """Two ranks: heads, sinks, every expert's width (MXFP4 groups included) split; expert down biases added once."""
    llm = LLM(checkpoints[kind], tensor_parallel_size=2, device="cpu", block_size=8, num_gpu_blocks=64,
              max_model_len=128, preemption_mode="swap", num_cpu_blocks=64)
    try:
        assert _tokens(llm) == expected[kind]
    finally:
        llm.engine.shutdown()


def test_tensor_parallel_4_splits_mxfp4_experts_in_whole_groups_padded_on_cpu(tmp_path):
    """Experts 160 wide (5 groups of 32) over 4 ranks: 2, 2, 1 and 0 real groups, each rank holding 2 groups' width
    (the last ranks' padding zero), as gpt-oss's 2880 splits over 4 or 8; HF's tokens all the same."""
    path = str(write_tiny_gpt_oss(tmp_path / "wide", mxfp4=True, intermediate_size=160))
    prompts = [PROMPTS[1], PROMPTS[4]]
    llm = LLM(path, tensor_parallel_size=4, device="cpu", block_size=8, num_gpu_blocks=64, max_model_len=128)
    try:
        assert _tokens(llm, prompts) == hf_greedy(path, prompts, MAX_NEW)
    finally:
        llm.engine.shutdown()
