"""The start-up warm-up: one run of every kind of step the engine's limits allow, before the engine says ready.

Triton compiles a kernel for each specialisation it meets: each constexpr value (tile sizes chosen from a step's
shape, split counts, a kernel variant), each integer argument's class (1, divisible by 16, neither) and each
dtype. An autotuned kernel times its configurations for each bucket of its key; torch's libraries load their
kernels on first use; the caching allocator grows at a step larger than any before. Whatever a step meets first
after ready, it pays on the step loop, and every stream in the batch waits (up to a second per kernel).

So the model runner, once its graphs are captured and its KV cache allocated, runs the steps below through its
own step path (plan, forward, sampling), generic over the kernels underneath: it knows no kernel, it spans the
space of shapes. Each dimension a kernel can specialise on is walked from its smallest to its largest value
along a `ladder` (every power-of-two bucket, and in each a multiple of 16 and a size that is not), one dimension
at a time around a small step:
- rows of one token (decodes) beyond the captured decode graphs, and within them (their feed path);
- decodes beside a prefill (the eager decode kernel), over context lengths doubling up to max_model_len, and
  over the number of such rows;
- prefill steps over their token count up to the step budget, with and without cached context (prefix hits,
  later chunks), and over their number of rows;
- every other step samples one row of each kind (greedy, seeded random, top-k/top-p/min-p, penalties, logprobs,
  forbidden ids before min_tokens); swap preemption copies blocks out and back.
Nothing is captured here (graphs are captured before), and the KV cache it writes holds no live sequence yet.
The library GEMMs of eager steps and the LM head, whose kernels follow their row count, are run at every row bucket
besides (gemm_warmup.py, row_buckets.py).
Structured outputs' mask kernel is warmed where its vocabulary is known: on the grammar thread, at its set-up.
Sleep mode's wake-up runs only `peak_steps`, the largest step of each walk: its kernels are still compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from railyard.engine.config import SamplingParams


@dataclass(frozen=True)
class WarmLimits:
    """What bounds a step: the engine's limits and what its captured graphs cover (0: no such graphs)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    decode_graph_batch: int = 0  # the largest decode batch a captured whole-step graph runs
    piecewise_tokens: int = 0  # the largest step the piecewise graphs run


@dataclass(frozen=True)
class WarmStep:
    """One synthetic step: leading one-token rows, then prefill rows; every row samples its last token."""

    decodes: tuple[int, ...] = ()  # each decode row's context length after the step
    prefills: tuple[tuple[int, int], ...] = ()  # each prefill row's (new tokens, tokens cached before them)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(n for n, _ in self.prefills)

    @property
    def num_seqs(self) -> int:
        return len(self.decodes) + len(self.prefills)

    def rows(self) -> list[tuple[int, int]]:
        """(new tokens, tokens cached before them) of every row, decodes first."""
        return [(1, ctx - 1) for ctx in self.decodes] + list(self.prefills)


def ladder(lo: int, hi: int) -> list[int]:
    """Sizes from lo to hi, both kept, that reach every power-of-two bucket between them, and in each a multiple
    of 16 and a size that is not where the bucket holds both: Triton specialises an integer argument on being 1
    and on dividing by 16, and kernels pick tiles (or autotune) by power-of-two buckets of a size."""
    if hi < lo:
        return []
    sizes = {lo, lo + 1, -(-lo // 16) * 16, hi // 16 * 16, hi}  # the ends, where they cut a bucket short
    sizes = {s for s in sizes if lo <= s <= hi}
    p = 1
    while p <= hi:
        sizes.update(s for s in (p, p + 1) if lo <= s <= hi)
        p *= 2
    return sorted(sizes)


def doubling(lo: int, hi: int) -> list[int]:
    """lo, 2 lo, 4 lo, ... below hi, and hi: context lengths, which reach kernels as device tensors and shape
    them only through buckets (a decode's context splits)."""
    sizes, s = [], lo
    while s < hi:
        sizes.append(s)
        s *= 2
    return sizes + [hi] if hi >= lo else sizes


def prefill_step(tokens: int, max_model_len: int) -> WarmStep:
    """A prefill step of this many tokens, in rows of max_model_len (the last one shorter)."""
    full, rest = divmod(tokens, max_model_len)
    return WarmStep(prefills=((max_model_len, 0),) * full + (((rest, 0),) if rest else ()))


def max_step_tokens(limits: WarmLimits) -> int:
    """The most tokens one step can carry: the budget, or max_num_seqs rows of max_model_len where that is fewer."""
    return min(limits.max_num_batched_tokens, limits.max_model_len * limits.max_num_seqs)


def _walks(limits: WarmLimits) -> list[list[WarmStep]]:
    """The warm-up's walks (module docstring): each along one dimension of a step, from its smallest value to its
    largest, every step at most the engine's limits."""
    B, T, L, bs = limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len, limits.block_size
    short = min(L, bs + 1)  # a decode's context: two blocks where it fits
    prompt = min(17, L, T - 1) if T > 1 else 0  # a prefill beside decodes: just past one 16-row query tile
    contexts = doubling(min(bs, L), L)
    walks: list[list[WarmStep]] = []
    # Decode-only steps: inside the captured graphs (their inputs and feed), then beyond them, where attention runs
    # eagerly; at the smallest eager batch (the most context splits) over context lengths.
    graphs = min(limits.decode_graph_batch, B, T)
    walks.append([WarmStep(decodes=(short,) * n) for n in ladder(1, graphs)])
    eager = ladder(graphs + 1, min(B, T))
    walks.append([WarmStep(decodes=(short,) * n) for n in eager])
    if eager:
        walks.append([WarmStep(decodes=(ctx,) * eager[0]) for ctx in contexts])
    if prompt and B > 1:
        # Decodes beside a prefill: over their context (one decode) and their number (short contexts).
        walks.append([WarmStep(decodes=(ctx,), prefills=((prompt, 0),)) for ctx in contexts])
        walks.append([WarmStep(decodes=(short,) * n, prefills=((prompt, 0),))
                      for n in ladder(1, min(B - 1, T - prompt))])
    # Prefill steps: over their tokens (rows of at most max_model_len, as many as the budget allows), over cached
    # context before a short chunk, and over their number of rows.
    walks.append([prefill_step(tokens, L) for tokens in ladder(2, max_step_tokens(limits))])
    if prompt and L > prompt:
        walks.append([WarmStep(prefills=((prompt, ctx),)) for ctx in doubling(min(bs, L - prompt), L - prompt)])
    if L >= 2:
        walks.append([WarmStep(prefills=((2, 0),) * n) for n in ladder(2, min(B, T // 2))])
    return [w for w in walks if w]


def warm_steps(limits: WarmLimits) -> list[WarmStep]:
    """The steps to run before ready (module docstring), each at most the engine's limits, without repeats."""
    return list(dict.fromkeys(step for walk in _walks(limits) for step in walk))


def peak_steps(limits: WarmLimits) -> list[WarmStep]:
    """The last step of each walk: the most tokens, rows and context any step of the warm-up holds, which is what
    the caching allocator grows to. Sleep mode's wake-up runs only these: its kernels are compiled (sleep frees
    memory, not kernels), but `torch.cuda.empty_cache()` gave the allocator's cached memory back, and without them
    the first large steps after wake-up would grow it again on the step loop."""
    return list(dict.fromkeys(walk[-1] for walk in _walks(limits)))


def sampling_variants() -> list[SamplingParams]:
    """One of each kind of row the sampler treats apart (its paths differ, and so do the kernels they launch)."""
    return [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=0.0, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=1.0, min_tokens=4, stop_token_ids=[0]),
    ]
