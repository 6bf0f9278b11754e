"""Plain data the engine hands to its callers.

Two levels, as in vLLM v1: the engine core emits `SeqDelta`s (token ids only: what one step added to
one sequence), which cross the process boundary; the front's OutputProcessor turns them into
`RequestOutput`s (text, stop strings, logprobs) for the API, the Ray replica and the offline LLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

OutputKind = Literal["cumulative", "delta", "final_only"]


class SeqDelta(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one engine step added to one sequence (engine core -> front, never cumulative)."""

    request_id: str
    index: int  # which of the request's n sequences
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None = None  # per new token: {token id: logprob}, sampled + top-k
    finish_reason: str | None = None  # "stop" (EOS or a stop token id), "length" or "abort" (ended by the core)
    stop_reason: int | str | None = None
    # On a sequence's first delta only (0 / None after): facts the front's metrics need.
    first_scheduled_time: float | None = None
    num_cached_prompt_tokens: int = 0


@dataclass
class CompletionOutput:
    """One of a request's n generated sequences: cumulative so far, or what is new (delta outputs)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # Per generated token: {token_id: logprob} for the sampled token and the top-k alternatives.
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, newer: CompletionOutput) -> None:
        """Append a later delta of the same sequence to this one."""
        self.text += newer.text
        self.token_ids = self.token_ids + newer.token_ids
        if newer.logprobs is not None:
            self.logprobs = (self.logprobs or []) + newer.logprobs
        self.cumulative_logprob = newer.cumulative_logprob
        self.finish_reason = newer.finish_reason
        self.stop_reason = newer.stop_reason


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic, the front's clock) and counts for latency metrics and usage."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_cached_prompt_tokens: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # over all n sequences
    longest_token_gap: float = 0.0  # the most seconds between two deliveries of new tokens (a stalled step shows)

    def time_per_output_token(self) -> float | None:
        """Seconds from the first token to the last over the tokens after the first (vLLM's TPOT); None for a
        request of fewer than two tokens."""
        if self.num_output_tokens < 2 or self.first_token_time is None or self.last_token_time is None:
            return None
        return (self.last_token_time - self.first_token_time) / (self.num_output_tokens - 1)


@dataclass
class RequestOutput:
    """A request's progress: cumulative, only what is new since the last output (delta), or final."""

    request_id: str
    prompt: str | None
    # Delta outputs carry the prompt ids in the first output only (None after): nothing is copied per step.
    prompt_token_ids: list[int] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None  # set when the request ended on an error (it alone, never the batch)

    def merge(self, newer: RequestOutput) -> None:
        """Fold a later delta output of the same request into this one (a reader that fell behind)."""
        by_index = {c.index: c for c in self.outputs}
        for c in newer.outputs:
            if c.index in by_index:
                by_index[c.index].extend(c)
            else:
                self.outputs.append(c)
                by_index[c.index] = c
        self.outputs.sort(key=lambda c: c.index)
        self.finished = newer.finished
        self.metrics = newer.metrics
        self.error = newer.error or self.error


@dataclass
class EngineStats:
    """A replica's load and cache state; layer 2 routes and scales on it."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks held by live sequences
    num_cpu_blocks: int = 0
    num_free_cpu_blocks: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    prompt_tokens_total: int = 0
    computed_tokens_total: int = 0  # tokens run through the model (prefill chunks + decodes)
    num_steps_total: int = 0  # forward passes; with decode_rows_total, what an average step carries
    decode_rows_total: int = 0  # of computed_tokens_total, single-token decodes (the rest is prefill)
    # of num_steps_total, steps that carried prefill tokens: they run piecewise graphs and eager attention instead
    # of one whole-step decode graph, so how arrivals spread over steps shows in step time
    prefill_steps_total: int = 0
    generation_tokens_total: int = 0
    num_preemptions_total: int = 0
    num_requests_finished_total: int = 0
    num_requests_added_total: int = 0  # requests the engine core accepted (the front counts what is in transit)
    # Triton kernels compiled or loaded after the engine was ready (startup/jit_watch.py): each is first-use work
    # that stalled the step loop, and should stay 0 (the start-up warm-up runs every kind of step first)
    jit_after_ready_total: int = 0
    block_size: int = 16
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    # [LoRA] adapters by name with running / waiting sequences (vLLM's vllm:lora_requests_info labels), and how
    # often an adapter was copied into a device slot
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)
    num_lora_loads_total: int = 0
    sleep_level: int = 0  # sleep mode: 0 awake, else the level the engine sleeps at (vLLM's engine_sleep_state)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def num_pending(self) -> int:
        """Work that has not finished: what the router and autoscaler look at."""
        return self.num_running + self.num_waiting + self.num_swapped
