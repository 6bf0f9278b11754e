"""FP8 under tensor parallelism on CPU (gloo): weight scales shard with their output channels, FP8 KV caches
swap on every rank. (The shards themselves: tests/engine/runner/layers/test_fp8.py.)

An FP8 KV cache changes nothing between one process and N: every rank stores the same rounded numbers
for its heads, so the tokens are identical. FP8 weights do differ slightly: a row-parallel layer's
input is split over ranks and each rank quantizes its own slice per token (as vLLM does), so its
scales are finer than one process's; the difference is FP8 rounding, not a wrong shard.
"""

from __future__ import annotations

import pytest

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.startup.tiny_model import write_tiny_checkpoint

pytestmark = pytest.mark.slow  # spawns tensor-parallel worker processes

PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 9, 17, 33, 40)]
# A KV pool too small for the whole batch: sequences get swapped out and back in on every rank.
ENGINE = dict(device="cpu", block_size=8, num_gpu_blocks=20, max_model_len=64, preemption_mode="swap",
              num_cpu_blocks=64)


def _run(path: str, tp: int, params: SamplingParams, **kw):
    llm = LLM(path, tensor_parallel_size=tp, **ENGINE, **kw)
    try:
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
        return outs, llm.engine.stats().num_preemptions_total
    finally:
        llm.engine.shutdown()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8-tp")
    return {"qwen2": str(write_tiny_checkpoint(root / "qwen2", "qwen2")),  # 2 KV heads: one per rank at tp 2
            "qwen3": str(write_tiny_checkpoint(root / "qwen3", "qwen3", num_key_value_heads=4))}


def test_fp8_kv_cache_generates_the_same_tokens_on_two_ranks_through_swaps(checkpoints):
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    one, _ = _run(checkpoints["qwen2"], 1, greedy, kv_cache_dtype="fp8")
    two, preemptions = _run(checkpoints["qwen2"], 2, greedy, kv_cache_dtype="fp8")
    assert [o.outputs[0].token_ids for o in two] == [o.outputs[0].token_ids for o in one]
    assert preemptions > 0


def test_fp8_weights_on_two_ranks_stay_closer_to_one_process_than_fp8_is_to_float(checkpoints):
    """First-token top-20 log-probabilities (qwen3: tied embeddings, q/k norm, 2 KV heads per rank).
    Measured largest difference over the shared top-20 tokens: 0.29 nats tp 2 vs 1 (0.25 for qwen2),
    0.50 FP8 vs float (0.91 for qwen2)."""
    first = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    path = checkpoints["qwen3"]
    fp8 = dict(quantization="fp8", kv_cache_dtype="fp8")
    float_one = [o.outputs[0].logprobs[0] for o in _run(path, 1, first)[0]]
    fp8_one = [o.outputs[0].logprobs[0] for o in _run(path, 1, first, **fp8)[0]]
    fp8_two = [o.outputs[0].logprobs[0] for o in _run(path, 2, first, **fp8)[0]]
    tp_gap, fp8_gap = _largest_gap(fp8_one, fp8_two), _largest_gap(float_one, fp8_one)
    assert tp_gap < 0.6 and tp_gap < fp8_gap, (tp_gap, fp8_gap)
    assert sum(max(a, key=a.get) == max(b, key=b.get) for a, b in zip(fp8_one, fp8_two)) >= 4


def _largest_gap(a: list[dict[int, float]], b: list[dict[int, float]]) -> float:
    shared = [(x, y, t) for x, y in zip(a, b) for t in set(x) & set(y)]
    assert len(shared) >= 15 * len(a)  # the top-20 lists overlap almost entirely
    return max(abs(x[t] - y[t]) for x, y, t in shared)
