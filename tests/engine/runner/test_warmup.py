"""The start-up warm-up spans every step the engine's limits allow, one dimension at a time, and running it changes
nothing a request later sees. Sleep mode's wake-up runs only its peak steps: as large as any step of the warm-up in
every dimension that sizes a step's memory, in a handful of steps.

Oracles: the kernels' own choice functions over every (rows, context) the limits allow (brute force on small
limits) against those of the warm-up's steps; the full warm-up's own largest steps, for its peak steps; an engine
that never warmed up, or the same engine before it slept, for the tokens."""

from __future__ import annotations

import pytest

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.runner.kernels.paged_attention import decode_splits
from railyard.engine.runner.warmup import WarmLimits, WarmStep, doubling, ladder, peak_steps, warm_steps

H200_SMS = 132
SMALL = WarmLimits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16,
                   decode_graph_batch=4, piecewise_tokens=32)


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _int_class(n: int) -> str:
    """How Triton specialises an integer argument."""
    return "one" if n == 1 else "multiple of 16" if n % 16 == 0 else "other"


@pytest.mark.parametrize("lo, hi", [(1, 1), (1, 8), (2, 300), (17, 2048), (2049, 8192), (48, 64), (40, 45), (5, 4)])
def test_a_ladder_reaches_every_power_of_two_bucket_with_and_without_a_multiple_of_16(lo, hi):
    sizes = ladder(lo, hi)
    if hi < lo:
        assert sizes == []
        return
    assert sizes[0] == lo and sizes[-1] == hi and sizes == sorted(set(sizes))
    for n in range(lo, hi + 1):
        assert any(_bucket(s) == _bucket(n) and _int_class(s) == _int_class(n) for s in sizes), n
    assert len(sizes) <= 2 * hi.bit_length() + 4


def test_doubling_keeps_both_ends():
    assert doubling(16, 100) == [16, 32, 64, 100] and doubling(16, 16) == [16] and doubling(16, 8) == []


@pytest.mark.parametrize("limits", [SMALL, WarmLimits(256, 8192, 32768, 16, 256, 2048), WarmLimits(4, 16, 32, 8)])
def test_no_step_exceeds_the_limits(limits):
    for step in warm_steps(limits):
        assert 1 <= step.num_seqs <= limits.max_num_seqs
        assert 1 <= step.num_tokens <= limits.max_num_batched_tokens
        assert all(1 <= new and cached + new <= limits.max_model_len for new, cached in step.rows())


def _eager_decodes(step: WarmStep, limits: WarmLimits) -> tuple[int, int] | None:
    """(decode rows, longest context) that a step puts through the eager decode kernel, as triton_backend does
    (decode-only steps within the captured graphs run the graphs' own, captured at max_model_len)."""
    if not step.decodes:
        return None
    if not step.prefills and len(step.decodes) <= limits.decode_graph_batch:
        return None
    return len(step.decodes), max(step.decodes)


def _decode_variant(splits: int) -> tuple[bool, int]:
    """What the decode kernels specialise on: writing the output directly (one split), the merge's split tile."""
    return splits == 1, max(2, _bucket(splits)) if splits > 1 else 0


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("graphs", [0, 4])
def test_every_decode_kernel_variant_a_step_can_select_is_selected_by_the_warm_up(kv_heads, graphs):
    limits = WarmLimits(8, 64, 512, 16, decode_graph_batch=graphs, piecewise_tokens=32)
    B, T, L = limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len
    reachable = set()
    for rows in range(1, min(B, T) + 1):
        beside_prefill = rows < B and rows < T  # room for a prefill row after the decodes
        if not (beside_prefill or rows > graphs):
            continue
        for ctx in range(1, L + 1):
            reachable.add(_decode_variant(decode_splits(rows, kv_heads, ctx, H200_SMS)))
    warmed = {_decode_variant(decode_splits(rows, kv_heads, ctx, H200_SMS))
              for step in warm_steps(limits) if (d := _eager_decodes(step, limits)) for rows, ctx in [d]}
    assert reachable <= warmed, f"never warmed: {sorted(reachable - warmed)}"


def test_prefills_meet_both_query_tiles_alone_and_beside_decodes():
    steps = warm_steps(SMALL)
    for beside in (False, True):
        tiles = {max(n for n, _ in s.prefills) > 16 for s in steps if s.prefills and bool(s.decodes) == beside}
        assert tiles == {False, True} or (beside and tiles == {True}), (beside, tiles)
    assert any(s.prefills and max(n for n, _ in s.prefills) <= 16 for s in steps)


def test_prefills_meet_cached_context_up_to_max_model_len():
    cached = [c for s in warm_steps(SMALL) for _, c in s.prefills]
    assert 0 in cached and max(cached) + 17 == SMALL.max_model_len


def test_steps_beyond_the_piecewise_graphs_meet_every_token_bucket_up_to_the_budget():
    limits = WarmLimits(64, 8192, 4096, 16, 64, 2048)
    eager = {s.num_tokens for s in warm_steps(limits) if s.num_tokens > limits.piecewise_tokens}
    for n in range(limits.piecewise_tokens + 1, limits.max_num_batched_tokens + 1):
        assert any(_bucket(t) == _bucket(n) and _int_class(t) == _int_class(n) for t in eager), n


def test_decode_batches_beyond_the_graphs_meet_every_size_bucket():
    limits = WarmLimits(300, 8192, 1024, 16, decode_graph_batch=64, piecewise_tokens=2048)
    sizes = {len(s.decodes) for s in warm_steps(limits) if s.decodes and not s.prefills}
    for n in range(65, 301):
        assert any(_bucket(b) == _bucket(n) and _int_class(b) == _int_class(n) for b in sizes), n


def _largest(steps: list[WarmStep]) -> dict[str, tuple[int, int, int, int]]:
    """Per kind of step (decodes only, prefills only, both): the most tokens, rows, context and cached context any
    of the steps holds (what sizes a step's activations, logits, sampling and attention buffers)."""
    largest: dict[str, tuple[int, int, int, int]] = {}
    for s in steps:
        kind = "decode" if not s.prefills else "prefill" if not s.decodes else "mixed"
        size = (s.num_tokens, s.num_seqs, max(n + c for n, c in s.rows()), max(c for _, c in s.rows()))
        largest[kind] = tuple(map(max, largest.get(kind, size), size))
    return largest


@pytest.mark.parametrize("limits", [SMALL, WarmLimits(256, 8192, 32768, 16, 256, 2048),
                                    WarmLimits(64, 4096, 4096, 16, 32, 2048), WarmLimits(300, 8192, 1024, 16, 64, 2048),
                                    WarmLimits(4, 16, 32, 8), WarmLimits(1, 1, 1, 16)])
def test_the_peak_steps_are_as_large_as_the_warm_up_in_every_dimension_in_a_handful_of_its_steps(limits):
    every, peaks = warm_steps(limits), peak_steps(limits)
    assert set(peaks) <= set(every)
    assert _largest(peaks) == _largest(every)
    assert len(peaks) <= 8  # one per walk of the warm-up


# -- running it ---------------------------------------------------------------------------------------------------
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 17, 40, 100)]
LIMITS = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)


def _generate(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY,
                                                         use_tqdm=False)]


@pytest.mark.parametrize(("arch", "extra"), [
    ("qwen2", {}),
    ("qwen2", dict(quantization="fp8", kv_cache_dtype="fp8", preemption_mode="swap", num_cpu_blocks=32)),
    ("qwen2", dict(enable_lora=True, max_loras=2)),  # rows through every adapter slot and the base model
    ("qwen3moe", {}),
], ids=["plain", "fp8-swap", "lora", "moe"])
def test_the_warm_up_runs_every_step_and_changes_no_token_after_it(tiny_models, arch, extra):
    warmed = LLM(tiny_models[arch], **LIMITS, **extra)
    runner = warmed.engine.executor.runner
    assert runner.warm_up() == len(warm_steps(runner.warm_limits()))
    assert runner._fed is None and runner._rows == {}  # no sequence's state left behind
    assert _generate(warmed) == _generate(LLM(tiny_models[arch], **LIMITS, **extra))


@pytest.mark.parametrize("extra", [{}, dict(preemption_mode="swap", num_cpu_blocks=32)], ids=["plain", "swap"])
def test_a_wake_up_runs_only_the_peak_steps_and_changes_no_token(tiny_models, extra):
    """What wake-up runs after its graphs on a GPU (ModelRunner.wake_up): a handful of steps, not the start's
    walk over every specialisation, and the engine serves the tokens it served before it slept."""
    llm = LLM(tiny_models["qwen2"], **LIMITS, **extra, enable_sleep_mode=True)
    runner = llm.engine.executor.runner
    before = _generate(llm)
    llm.sleep(1)
    llm.wake_up()
    limits = runner.warm_limits()
    assert runner.warm_up(peaks_only=True) == len(peak_steps(limits))
    assert 3 * len(peak_steps(limits)) < len(warm_steps(limits))
    assert runner._fed is None and runner._rows == {}
    assert _generate(llm) == before
