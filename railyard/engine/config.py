"""Engine and sampling options, validated once at construction with messages a user can act on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from railyard.errors import ConfigError, InvalidRequestError

SchedulingPolicy = Literal["fcfs", "priority"]
PreemptionMode = Literal["recompute", "swap"]

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("auto", "torch", "triton")
_QUANTIZATIONS = (None, "fp8")
# "auto": the model dtype. "bfloat16": a half-precision cache under a float32 model (accuracy comparisons).
_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8")


@dataclass
class EngineConfig:
    """How one engine replica batches, caches and runs its model (vLLM's engine arguments)."""

    model: str = ""
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None  # override the profiled KV pool size (tests, experiments)
    swap_space: float = 4.0  # GiB of CPU memory for swap-mode preemption
    num_cpu_blocks: int | None = None  # override the swap pool size
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: SchedulingPolicy = "fcfs"
    preemption_mode: PreemptionMode = "recompute"
    tensor_parallel_size: int = 1
    attention_backend: str = "auto"
    # "fp8": linear layers in float8_e4m3fn with per-output-channel scales (quantized at load unless the
    # checkpoint already is FP8), activations quantized per token; the embedding and LM head stay as they are.
    quantization: str | None = None
    # "fp8": the KV cache in float8_e4m3fn with one K and one V scale per layer (half the bytes of bf16).
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    # Plan step N+1 while step N runs on the device (single-process executors; see Engine.step).
    async_scheduling: bool = True
    cuda_graph_max_batch_size: int = 256
    seed: int = 0
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32):
            raise ConfigError(f"block_size must be 8, 16 or 32, got {self.block_size}")
        _positive("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_gpu_blocks is not None:
            _positive("num_gpu_blocks", self.num_gpu_blocks)
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ConfigError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.swap_space < 0:
            raise ConfigError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ConfigError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _choice("dtype", self.dtype, _DTYPES)
        _choice("device", self.device, _DEVICES)
        _choice("attention_backend", self.attention_backend, _BACKENDS)
        if self.quantization not in _QUANTIZATIONS:
            raise ConfigError(f"quantization must be fp8 (or unset), got {self.quantization!r}")
        _choice("kv_cache_dtype", self.kv_cache_dtype, _KV_CACHE_DTYPES)

    def resolve(self, model_max_len: int) -> None:
        """Fill the options whose defaults depend on the model (called once the config.json is read)."""
        if self.max_model_len is None:
            self.max_model_len = model_max_len
        elif self.max_model_len > model_max_len:
            raise ConfigError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{model_max_len}; lower --max-model-len"
            )
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(2048, self.max_num_seqs) if self.enable_chunked_prefill \
                else max(self.max_model_len, self.max_num_seqs)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} < max_model_len {self.max_model_len}: "
                "without chunked prefill a long prompt could never be scheduled; raise it or enable chunked prefill"
            )

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass
class SamplingParams:
    """How to pick tokens for one request and when to stop (vLLM's SamplingParams)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token
    prompt_logprobs: None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # "cumulative": after every step, everything so far; "delta": after every step, only what is new
    # (streaming: nothing is copied per step); "final_only": once, when the request finishes (offline).
    output_kind: Literal["cumulative", "delta", "final_only"] = "cumulative"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (isinstance(self.n, int) and 1 <= self.n <= 128, f"n must be an integer in [1, 128], got {self.n}"),
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (isinstance(self.top_k, int) and self.top_k >= 0,
             f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
             f"max_tokens must be at least 1, got {self.max_tokens}"),
            (isinstance(self.min_tokens, int) and self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
             f"logprobs must be an integer in [0, 20], got {self.logprobs}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be a list of non-empty strings"),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be non-negative integers"),
            (self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}"),
            # Both become int64 tensors / generator seeds in the step: out of range they would fail the whole batch.
            (not isinstance(self.seed, int) or -2**63 <= self.seed <= 2**63 - 129,
             f"seed must fit in int64, got {self.seed}"),
            (not isinstance(self.top_k, int) or self.top_k < 2**31, f"top_k must be below 2**31, got {self.top_k}"),
            (self.output_kind in ("cumulative", "delta", "final_only"),
             f"output_kind must be 'cumulative', 'delta' or 'final_only', got {self.output_kind!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_output_history(self) -> bool:
        """Penalties read every output token on the host when the next token is sampled."""
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
