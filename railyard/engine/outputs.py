"""Plain data the engine hands to its callers: per-request outputs and engine-wide stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One of a request's n generated sequences, cumulative so far."""

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


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic) for latency metrics."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_cached_prompt_tokens: int = 0


@dataclass
class RequestOutput:
    """The state of one request after an engine step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None  # set when the request ended on an error (it alone, never the batch)


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
    generation_tokens_total: int = 0
    num_preemptions_total: int = 0
    num_requests_finished_total: int = 0
    block_size: int = 16
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def num_pending(self) -> int:
        """Work that has not finished: what the router and autoscaler look at."""
        return self.num_running + self.num_waiting + self.num_swapped
