"""`railyard bench throughput`: offline throughput of one engine on a seeded synthetic workload."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from tqdm import tqdm

from railyard.bench.serve import stats_ms
from railyard.bench.workload import LengthRange, Request, synthetic_requests
from railyard.engine.config import SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.lora.request import LoRARequest


@dataclass
class ThroughputResult:
    num_prompts: int
    elapsed_s: float
    prompt_tokens: int
    output_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_preemptions: int
    prefix_cache_hit_rate: float
    num_kv_blocks: int
    warmup_prompts: int = 0
    # Per request, from the submission of the whole workload: time to its first token, and per output token after.
    ttft_ms: dict[str, float | None] | None = None
    tpot_ms: dict[str, float | None] | None = None
    # The longest time any request waited between two of its tokens: a step stalled on first-use work shows here
    longest_token_gap_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_throughput(engine: Engine, num_prompts: int, input_len: LengthRange, output_len: LengthRange,
                   seed: int = 0, warmup_prompts: int = 0, token_id_range: int | None = None,
                   progress: bool = False, loras: list[LoRARequest] | None = None,
                   repeat: int = 0) -> ThroughputResult:
    """Submit every request at once (ignore_eos, greedy) and time until all have finished.

    warmup_prompts: first run that many other prompts (another seed: no prefix-cache hits on the measured
    ones) of the same lengths for 4 tokens, untimed, so kernel compilation is not measured.
    progress: a progress bar of finished requests on stderr (for a terminal).
    loras: LoRA adapters (loaded) the requests are spread over evenly, request i to loras[i % len(loras)].
    repeat: k > 0 runs the same lengths with other token ids (no prefix hits on an earlier run's prompts)."""
    if warmup_prompts:
        warm = workload_requests(engine, warmup_prompts, input_len, LengthRange(4, 4), seed + 1, token_id_range)
        _run(engine, warm, "warmup", progress, loras)
    before = engine.stats()
    reqs = workload_requests(engine, num_prompts, input_len, output_len, seed, token_id_range, repeat)
    start = time.perf_counter()
    out_tokens, ttfts, tpots, gap = _run(engine, reqs, f"bench{repeat or ''}", progress, loras)
    elapsed = time.perf_counter() - start
    prompt_tokens = sum(len(r.prompt_token_ids) for r in reqs)
    stats = engine.stats()
    queries = stats.prefix_cache_queries - before.prefix_cache_queries
    hits = stats.prefix_cache_hits - before.prefix_cache_hits
    return ThroughputResult(
        num_prompts=num_prompts, elapsed_s=round(elapsed, 4), prompt_tokens=prompt_tokens,
        output_tokens=out_tokens, requests_per_s=num_prompts / elapsed, output_tokens_per_s=out_tokens / elapsed,
        total_tokens_per_s=(prompt_tokens + out_tokens) / elapsed,
        num_preemptions=stats.num_preemptions_total - before.num_preemptions_total,
        prefix_cache_hit_rate=hits / queries if queries else 0.0, num_kv_blocks=stats.num_total_blocks,
        warmup_prompts=warmup_prompts, ttft_ms=stats_ms(ttfts), tpot_ms=stats_ms(tpots),
        longest_token_gap_ms=round(gap * 1000, 3))


def _run(engine: Engine, reqs: list[Request], prefix: str, progress: bool = False,
         loras: list[LoRARequest] | None = None) -> tuple[int, list[float], list[float], float]:
    """Add every request, step until all finished; returns the output tokens, each request's TTFT and TPOT, and
    the longest gap between two tokens of any request."""
    for i, r in enumerate(reqs):
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                output_kind="final_only")
        engine.add_request(f"{prefix}-{i}", None, params, prompt_token_ids=r.prompt_token_ids,
                           lora_request=loras[i % len(loras)] if loras else None)
    done = out_tokens = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    gap = 0.0
    with tqdm(total=len(reqs), desc=prefix, unit="req", disable=not progress) as bar:
        while done < len(reqs):
            for out in engine.step():
                if out.finished:
                    done += 1
                    out_tokens += sum(len(c.token_ids) for c in out.outputs)
                    bar.update(1)
                    m = out.metrics
                    gap = max(gap, m.longest_token_gap)
                    if m.first_token_time is not None:
                        ttfts.append(m.first_token_time - m.arrival_time)
                        if m.finished_time is not None and m.num_output_tokens > 1:
                            tpots.append((m.finished_time - m.first_token_time) / (m.num_output_tokens - 1))
    return out_tokens, ttfts, tpots, gap


def workload_requests(engine: Engine, num_prompts: int, input_len: LengthRange, output_len: LengthRange,
                      seed: int = 0, token_id_range: int | None = None, repeat: int = 0) -> list[Request]:
    """The seeded workload; for a named shape, token ids in [100, vocab - 100) as hf_baseline.py draws them,
    so both run the very same prompts. With token_id_range, ids below it, exactly as `railyard bench serve`
    draws them (the same requests offline and served). repeat k > 0: the same lengths, other token ids."""
    from railyard.shapes import is_shape

    tokens_seed = None if repeat == 0 else seed * 1000 + 997 * repeat
    if token_id_range is not None:
        return synthetic_requests(num_prompts, input_len, output_len, token_id_range, seed, tokens_seed=tokens_seed)
    margin = 100 if is_shape(engine.config.model) else 0
    return synthetic_requests(num_prompts, input_len, output_len, engine.spec.vocab_size, seed, margin, margin,
                              tokens_seed)
