"""The library GEMMs of an eager step are recorded from one real forward pass, each distinct product once, and run
at every row bucket before ready; the LM head at every bucket of sampled rows.

Oracles: the model's own linear layers (their weight shapes) for what is recorded; a recording of the products'
calls for the rows they run at; the engine's tokens before and after the walk."""

from __future__ import annotations

import random
import time

import pytest
import torch
import torch.nn.functional as F

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.llm import LLM
from railyard.engine.runner.gemm_warmup import LinearRecorder, record_products, warm_products
from railyard.engine.runner.row_buckets import row_buckets
from railyard.engine.runner.warmup import WarmStep


def test_a_recording_keeps_each_distinct_product_once_and_runs_the_code_as_is():
    a, b = torch.randn(8, 4), torch.randn(6, 8)
    bias = torch.randn(6)
    x = torch.randn(3, 4)

    def forward():
        h = F.linear(x, a)
        h = F.linear(h, a.new_zeros(8, 8)) + h  # another weight, another shape
        h = F.linear(h, torch.randn(8, 8))  # the same shape again: the same product
        return F.linear(h, b, bias)

    with LinearRecorder() as recorder:
        out = forward()
    assert out.shape == (3, 6)
    shapes = sorted((tuple(p.weight.shape), p.bias is not None) for p in recorder.products.values())
    assert shapes == [((6, 8), True), ((8, 4), False), ((8, 8), False)]
    assert len(record_products(forward)) == 3


def test_each_product_runs_once_at_each_row_count_on_a_contiguous_input():
    products = record_products(lambda: F.linear(F.linear(torch.randn(2, 4), torch.randn(8, 4)), torch.randn(5, 8)))
    seen = []
    linear = F.linear

    def spy(x, w, bias=None):
        seen.append((x.shape[0], tuple(w.shape), x.is_contiguous()))
        return linear(x, w, bias)

    F.linear = spy
    try:
        runs = warm_products(products, [3, 1, 7, 3], torch.device("cpu"))
    finally:
        F.linear = linear
    assert runs == 6 == len(seen)
    assert sorted(seen) == sorted((rows, shape, True) for rows in (1, 3, 7) for shape in ((8, 4), (5, 8)))
    assert warm_products([], [1, 2], torch.device("cpu")) == 0


def _prompt_tokens(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(n)] for i, n in enumerate((5, 40, 90))]
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                         use_tqdm=False)]


def test_the_runner_walks_every_linear_layer_shape_at_every_eager_bucket_and_the_lm_head_at_every_sampled_bucket(
        tiny_model):
    llm = LLM(tiny_model, device="cpu", block_size=8, max_num_batched_tokens=128, max_num_seqs=8)
    runner = llm.engine.executor.runner
    before = _prompt_tokens(llm)
    layer_shapes = {tuple(m.weight.shape) for m in runner.model.model.layers[0].modules() if hasattr(m, "_matmul")}
    head = tuple(runner.model.lm_head.weight.shape)
    calls = []
    linear = F.linear
    F.linear = lambda x, w, bias=None: calls.append((x.shape[0], tuple(w.shape))) or linear(x, w, bias)
    try:
        runs = runner.warm_library_products()
    finally:
        F.linear = linear
    eager, sampled = row_buckets(1, 128), row_buckets(1, 8)  # no piecewise graphs on the CPU: every step is eager
    walked = {(rows, shape) for rows, shape in calls}
    assert {(rows, shape) for rows in eager for shape in layer_shapes} <= walked
    assert {(rows, head) for rows in sampled} <= walked
    assert not {(rows, shape) for rows, shape in walked if shape == head and rows > 8}  # the head: sampled rows only
    assert runs == len(eager) * len({s for _, s in walked if s != head}) + len(sampled)
    assert _prompt_tokens(llm) == before  # the walk leaves nothing a request sees


def test_the_start_up_warm_up_walks_the_library_products_on_a_gpu_only():
    # On the CPU no library loads kernels on first use: the warm-up leaves the walk out.
    engine = Engine(EngineConfig(model="tiny-qwen2-seed0", device="cpu", max_num_batched_tokens=64))
    runner = engine.executor.runner
    walked = []
    runner.warm_library_products = lambda: walked.append(1) or 0
    runner.warm_up()
    assert walked == []


SLEEP_CYCLES = 400_000_000  # the step still running on the device when the next one launches: ~0.2 s


def blocked_launches(runner, counts: list[int], rng: random.Random) -> list[tuple[int, int, float, float]]:
    """(tokens, sampled rows, host s, device s) of each eager step whose launch waited for the device: launched
    behind a kernel that keeps the device busy, as asynchronous scheduling launches a step behind the one running,
    a launch that returns before that kernel is half done did not wait."""
    c = runner.config
    blocked = []
    for n in counts:
        m = rng.randrange(-(-n // c.max_model_len), min(c.max_num_seqs, n) + 1)  # rows of at most max_model_len
        lengths = [n // m + (i < n % m) for i in range(m)]
        plan = runner._warm_plan(WarmStep(prefills=tuple((k, 0) for k in lengths)), first_block=0, fed_rows=0)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        end.record()
        t = time.perf_counter()
        runner.compute_logits(plan)
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        busy = start.elapsed_time(end) / 1000
        if host > busy / 2:
            blocked.append((n, m, round(host, 3), round(busy, 3)))
    return blocked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a library's kernels load on first use on a GPU")
def test_after_ready_no_eager_step_waits_on_the_device_for_a_library_kernel():
    engine = Engine.from_config(EngineConfig(model="qwen3-0.6b", max_num_batched_tokens=8192, max_num_seqs=64,
                                             max_model_len=4096))
    runner = engine.executor.runner
    lo = runner.piecewise.max_tokens + 1
    rng = random.Random(0)
    counts = [lo, 8192] + rng.sample(range(lo, 8192), 40)  # token counts and sampled rows no warm-up step had
    assert blocked_launches(runner, counts, rng) == []
