"""Piecewise CUDA graphs: the forward pass split at each attention, padded to a token-count bucket, must give
the unsplit forward's results.

On the CPU the pieces run eagerly (`capture=False`) through the same static buffers and padding the graphs
replay, so the split and its wiring are checked everywhere; on a GPU the captured graphs are checked against
the eager forward, and greedy output against HF transformers.
"""

from __future__ import annotations

import random

import pytest
import torch

from railyard import LLM, SamplingParams
from railyard.engine.runner.piecewise_graphs import PiecewiseGraphs, piecewise_sizes
from tests.engine.hf_oracle import hf_greedy
from tests.engine.runner.step_plans import filled_caches, small_runner, step_plan

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")

# (tokens already cached, new tokens) per sequence of one step
STEPS = {
    "mixed-prefill-and-decode": [(5, 1), (0, 7), (9, 4), (17, 1)],  # 13 tokens: padded to 16
    "prefill-only": [(0, 11), (3, 6)],  # 17 tokens: padded to 32
    "decode-only": [(4, 1), (12, 1), (30, 1)],  # 3 tokens: padded to 16
    "exactly-a-bucket": [(0, 16)],  # no padding
}


def test_buckets_pad_by_at_most_half_below_256_tokens_a_quarter_above_and_end_at_the_max():
    assert piecewise_sizes(2048) == [16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280,
                                     1536, 1792, 2048]
    assert piecewise_sizes(100) == [16, 32, 64, 96, 100]  # the largest step itself is always a bucket
    assert piecewise_sizes(16) == [16]


def _unsplit_and_piecewise(runner, graphs: PiecewiseGraphs, plan: StepPlan):
    """(hidden, caches) of the unsplit forward and of the pieces, from identical caches."""
    dev = runner.device
    meta = runner.to_metadata(plan)
    caches = filled_caches(runner)
    ref_caches, pw_caches = [c.clone() for c in caches], [c.clone() for c in caches]
    with torch.inference_mode():
        ids = torch.tensor(plan.input_ids, device=dev)
        pos = torch.tensor(plan.positions, device=dev)
        ref = runner.model(ids, pos, ref_caches, meta)
        got = graphs.run(plan.input_ids, plan.positions, pw_caches, meta).clone()
    return (ref, ref_caches), (got, pw_caches)


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("arch,config", [
    ("qwen2", {}), ("qwen3", {}), ("llama", {}), ("qwen3", dict(quantization="fp8")), ("qwen3moe", {}),
], ids=["qwen2", "qwen3", "llama", "qwen3-fp8-weights", "qwen3moe"])
def test_pieces_in_sequence_with_padding_give_the_unsplit_forward(tiny_models, arch, config, step):
    runner = small_runner(tiny_models[arch], "cpu", **config)
    graphs = PiecewiseGraphs(runner.model, 64, runner.device, capture=False)
    plan = step_plan(runner, STEPS[step], random.Random(step))
    (ref, ref_caches), (got, pw_caches) = _unsplit_and_piecewise(runner, graphs, plan)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # Padded rows write no KV: the caches hold what the unsplit forward wrote (to float32 rounding: a GEMM
    # of 16 rows may round a row differently from one of 3), and nothing else.
    for a, b in zip(pw_caches, ref_caches):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_padded_rows_do_not_change_real_rows(tiny_models):
    # The same step padded to two buckets (16 and 64 rows) gives the same real rows: every piece is row-wise.
    runner = small_runner(tiny_models["qwen2"], "cpu")
    plan = step_plan(runner, STEPS["mixed-prefill-and-decode"], random.Random(0))
    small = PiecewiseGraphs(runner.model, 16, runner.device, capture=False)
    large = PiecewiseGraphs(runner.model, 64, runner.device, capture=False)
    large.sizes = [64]  # force the largest bucket
    (_, _), (a, _) = _unsplit_and_piecewise(runner, small, plan)
    (_, _), (b, _) = _unsplit_and_piecewise(runner, large, plan)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


PROMPTS = [[random.Random(n).randrange(256) for _ in range(n)] for n in (3, 17, 33, 70, 9)]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3moe"])
def test_engine_through_the_pieces_matches_hf_generate(tiny_models, arch):
    # Chunked prefill under a 24-token budget: steps mix prefill chunks with decodes, and the asynchronous
    # scheduler feeds sampled ids into the pieces' static input buffer.
    llm = LLM(tiny_models[arch], device="cpu", block_size=8, max_num_batched_tokens=24)
    runner = llm.engine.executor.runner
    runner.piecewise = PiecewiseGraphs(runner.model, 24, runner.device, capture=False)
    calls = []
    run = runner.piecewise.run
    runner.piecewise.run = lambda *a, **k: calls.append(len(a[0])) or run(*a, **k)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(tiny_models[arch], PROMPTS, 12)
    assert any(n > len(PROMPTS) for n in calls), "no step carried a prefill chunk through the pieces"


# -- on a GPU: captured graphs ---------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("config", [dict(dtype="float32"), dict(dtype="bfloat16"),
                                    dict(dtype="bfloat16", quantization="fp8")],
                         ids=["float32", "bfloat16", "bfloat16-fp8-weights"])
def test_graph_replay_matches_the_eager_forward_on_gpu(tiny_models, config, step):
    runner = small_runner(tiny_models["qwen3"], "cuda", attention_backend="triton", **config)
    assert runner.piecewise is not None and runner.piecewise.graphs, "piecewise graphs were not captured"
    plan = step_plan(runner, STEPS[step], random.Random(step))
    (ref, ref_caches), (got, pw_caches) = _unsplit_and_piecewise(runner, runner.piecewise, plan)
    # Padding changes the GEMMs' row counts and with them cuBLAS's kernels (rounding, in bf16 and in the FP8
    # activations' per-token scales); a wrong buffer or piece would be off by O(1).
    tol = 1e-4 if config["dtype"] == "float32" else 5e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
    for a, b in zip(pw_caches, ref_caches):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@needs_cuda
def test_graph_replay_is_the_same_every_time_on_gpu(tiny_models):
    runner = small_runner(tiny_models["qwen2"], "cuda", attention_backend="triton")
    plan = step_plan(runner, STEPS["mixed-prefill-and-decode"], random.Random(1))
    (_, _), (a, _) = _unsplit_and_piecewise(runner, runner.piecewise, plan)
    (_, _), (b, _) = _unsplit_and_piecewise(runner, runner.piecewise, plan)
    assert torch.equal(a, b)


@needs_cuda
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama", "qwen3moe"])
def test_engine_with_captured_pieces_matches_hf_generate_on_gpu(tiny_models, arch):
    llm = LLM(tiny_models[arch], device="cuda", dtype="float32", attention_backend="triton", block_size=8,
              max_num_batched_tokens=24)
    assert llm.engine.executor.runner.piecewise is not None
    assert "weights" in llm.engine.executor.runner.startup.background  # loaded beside the capture, and right
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(tiny_models[arch], PROMPTS, 12)


@needs_cuda
def test_buckets_captured_without_a_warm_up_of_their_own_replay_the_eager_forward_on_gpu(tiny_models):
    """Only the largest bucket (and any whose capture met a kernel not loaded yet) runs eagerly before its capture;
    the others are captured straight away (graph_capture.capture_each) and must still give the eager forward."""
    runner = small_runner(tiny_models["qwen3"], "cuda", attention_backend="triton", dtype="float32")
    pw = runner.piecewise
    assert pw.warmed_up[0] == pw.sizes[-1] and len(pw.warmed_up) < len(pw.sizes)
    assert runner.graphs.warmed_up[0] == runner.graphs.sizes[-1]
    for step in ("mixed-prefill-and-decode", "prefill-only"):  # buckets 16 and 32
        plan = step_plan(runner, STEPS[step], random.Random(step))
        bucket = -(-len(plan.input_ids) // 16) * 16
        assert bucket in pw.graphs and bucket not in pw.warmed_up
        (ref, _), (got, _) = _unsplit_and_piecewise(runner, pw, plan)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
