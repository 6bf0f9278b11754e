"""Engine and sampling options, validated once at construction with messages a user can act on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from railyard.engine.structured.params import StructuredOutputsParams
from railyard.errors import ConfigError, InvalidRequestError
from railyard.model.chat_format import ReasoningParserName, ToolCallParserName
from railyard.model.precision import DTYPES, Fp8Gemm, check_kv_cache_dtype, check_quantization
from railyard.model.spec import check_max_model_len

SchedulingPolicy = Literal["fcfs", "priority"]
PreemptionMode = Literal["recompute", "swap"]

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
MAX_LORA_RANK = 64  # the widest adapter the batched LoRA kernels take (their rank tile)
_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("auto", "torch", "triton")


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
    # With chunked prefill, at most this many prompt tokens of one request per step (0: up to the budget), as
    # vLLM's option of the same name: a long prompt joining running decodes then lengthens their step little.
    long_prefill_token_threshold: int = 0
    # With chunked prefill, at most this many prompt tokens in all per step while the step also carries decodes
    # (0: off): what bounds a running stream's inter-token gap when prompts keep arriving (Sarathi-Serve's
    # stall-free batching); a step without decodes still takes the whole budget.
    max_prefill_tokens_with_decodes: int = 0
    scheduling_policy: SchedulingPolicy = "fcfs"
    preemption_mode: PreemptionMode = "recompute"
    tensor_parallel_size: int = 1
    # How long a tensor-parallel collective (and the ranks' rendezvous) waits for a peer before the engine reports
    # the group dead: the backstop behind the executor's watch of its workers' processes.
    tp_timeout_s: float = 600.0
    # torch's intra-op threads in the engine process (None: every core but one on the CPU, which the front's event
    # loop keeps; torch's own choice on a GPU). Replicas sharing a machine's few cores take fewer.
    torch_threads: int | None = None
    attention_backend: str = "auto"
    # "fp8": linear layers in float8_e4m3fn with per-output-channel scales (quantized at load unless the
    # checkpoint already is FP8), activations quantized per token; the embedding and LM head stay as they are.
    quantization: str | None = None
    # With FP8 weights on FP8 tensor cores, which GEMM: "rowwise" (torch's row-wise scaled _scaled_mm),
    # "rowwise-fast" (the same with fast accumulation), "cublaslt" (an unscaled cuBLASLt GEMM, the scales applied
    # after), "cublaslt-fast" (the same with fast accumulation), "auto" (by shape: cuBLASLt for GEMMs of up to
    # layers/fp8.py's CUBLASLT_MAX_TOKENS rows the row-wise kernel would not spread over the GPU) or "triton"
    # (a Triton GEMM, scales in its epilogue); layers/fp8.py says why. Elsewhere only "auto" (the reference
    # path) runs.
    fp8_gemm: Fp8Gemm = "auto"
    # "fp8": the KV cache in float8_e4m3fn with one K and one V scale per layer (half the bytes of bf16).
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    # Plan step N+1 while step N runs on the device (single-process executors; see Engine.step).
    async_scheduling: bool = True
    cuda_graph_max_batch_size: int = 256
    # Steps that are not pure decode (prefill chunks, mixed steps) replay CUDA graphs of everything but
    # attention (vLLM v1's piecewise graphs); off: they run eagerly. enforce_eager turns both kinds off.
    piecewise_cuda_graphs: bool = True
    # JSON constraints allow no whitespace beyond ", " and ": " unless a request says otherwise (vLLM's
    # structured-outputs disable_any_whitespace): weak models can loop on whitespace a grammar allows.
    structured_outputs_disable_any_whitespace: bool = False
    # The chat endpoint's parsers of reasoning and tool calls ("auto": by the checkpoint's chat template; see
    # railyard/api/output_parsers.py). The front reads them; the engine itself never does.
    reasoning_parser: ReasoningParserName = "auto"
    tool_call_parser: ToolCallParserName = "auto"
    seed: int = 0
    served_model_name: str | None = None
    # LoRA adapters (vLLM's names): requests of several adapters and of the base model share each step. max_loras
    # adapters are resident on the device at once (slots, evicted least recently used, never one a running request
    # uses), max_cpu_loras kept in host memory (default: max_loras), ranks up to max_lora_rank.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Sleep mode (vLLM's enable_sleep_mode): sleep(level) gives back the device memory of the KV cache, the CUDA graphs
    # and the weights (level 1: to pinned host memory; level 2: discarded, read from the checkpoint again) while the
    # engine keeps its process, CUDA context and compiled kernels; wake_up() restores them in the time of a copy and
    # a capture instead of a start. Off: sleep is refused (a sleeping engine serves nothing until woken).
    enable_sleep_mode: bool = False

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32):
            raise ConfigError(f"block_size must be 8, 16 or 32, got {self.block_size}")
        _positive("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if not isinstance(self.long_prefill_token_threshold, int) or self.long_prefill_token_threshold < 0:
            raise ConfigError(f"long_prefill_token_threshold must be an integer >= 0 (0: off), got "
                              f"{self.long_prefill_token_threshold!r}")
        if not isinstance(self.max_prefill_tokens_with_decodes, int) or self.max_prefill_tokens_with_decodes < 0:
            raise ConfigError(f"max_prefill_tokens_with_decodes must be an integer >= 0 (0: off), got "
                              f"{self.max_prefill_tokens_with_decodes!r}")
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
        if not self.tp_timeout_s > 0:
            raise ConfigError(f"tp_timeout_s must be > 0 seconds, got {self.tp_timeout_s}")
        if self.torch_threads is not None:
            _positive("torch_threads", self.torch_threads)
        _choice("dtype", self.dtype, DTYPES)
        _choice("device", self.device, _DEVICES)
        _choice("attention_backend", self.attention_backend, _BACKENDS)
        check_quantization(self.quantization)  # the precisions of model/precision.py, which sizes them
        check_kv_cache_dtype(self.kv_cache_dtype)
        _choice("fp8_gemm", self.fp8_gemm, get_args(Fp8Gemm))
        _choice("reasoning_parser", self.reasoning_parser, get_args(ReasoningParserName))
        _choice("tool_call_parser", self.tool_call_parser, get_args(ToolCallParserName))
        harmony = (self.reasoning_parser == "openai_gptoss", self.tool_call_parser == "openai")
        if any(harmony) and not all(harmony) and "auto" not in (self.reasoning_parser, self.tool_call_parser):
            raise ConfigError("reasoning_parser openai_gptoss and tool_call_parser openai go together: harmony's one "
                              "parser reads gpt-oss's reasoning and tool calls (leave the other at auto)")
        self._check_lora()

    def _check_lora(self) -> None:
        _positive("max_loras", self.max_loras)
        _positive("max_lora_rank", self.max_lora_rank)
        if self.max_lora_rank > MAX_LORA_RANK:
            raise ConfigError(f"max_lora_rank must be at most {MAX_LORA_RANK}, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None:
            _positive("max_cpu_loras", self.max_cpu_loras)
            if self.max_cpu_loras < self.max_loras:
                raise ConfigError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                                  f"({self.max_loras}): every adapter on the device is also held in host memory")

    def resolve(self, model_max_len: int) -> None:
        """Fill the options whose defaults depend on the model (called once the config.json is read)."""
        if self.max_model_len is None:
            self.max_model_len = model_max_len
        check_max_model_len(self.max_model_len, model_max_len)
        if self.max_num_batched_tokens is None:
            # 8,192: of 2,048 / 8,192 / 16,384 it served the most tokens/s with the lowest TTFT and TPOT p99
            # (16,384 is faster offline only); docs/lab-notes, online serving.
            self.max_num_batched_tokens = max(DEFAULT_MAX_NUM_BATCHED_TOKENS, self.max_num_seqs) \
                if self.enable_chunked_prefill \
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
    # Constrained decoding: the output must match this JSON schema / regex / choice / grammar.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:
                raise InvalidRequestError(f"structured_outputs: {exc}") from None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        # Messages are formatted only for a failed check: every request builds (and decodes) one of these.
        checks = [
            (isinstance(self.n, int) and 1 <= self.n <= 128, "n must be an integer in [1, 128], got {s.n}"),
            (self.temperature >= 0.0, "temperature must be >= 0, got {s.temperature}"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1], got {s.top_p}"),
            (isinstance(self.top_k, int) and self.top_k >= 0,
             "top_k must be -1, 0 (disabled) or a positive integer, got {s.top_k}"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1], got {s.min_p}"),
            (self.repetition_penalty > 0.0, "repetition_penalty must be > 0, got {s.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2], got {s.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             "frequency_penalty must be in [-2, 2], got {s.frequency_penalty}"),
            (self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
             "max_tokens must be at least 1, got {s.max_tokens}"),
            (isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens must be >= 0, got {s.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             "min_tokens ({s.min_tokens}) must not exceed max_tokens ({s.max_tokens})"),
            (self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
             "logprobs must be an integer in [0, 20], got {s.logprobs}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be a list of non-empty strings"),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be non-negative integers"),
            (self.seed is None or isinstance(self.seed, int), "seed must be an integer, got {s.seed!r}"),
            # Both become int64 tensors / generator seeds in the step: out of range they would fail the whole batch.
            (not isinstance(self.seed, int) or -2**63 <= self.seed <= 2**63 - 129,
             "seed must fit in int64, got {s.seed}"),
            (not isinstance(self.top_k, int) or self.top_k < 2**31, "top_k must be below 2**31, got {s.top_k}"),
            (self.output_kind in ("cumulative", "delta", "final_only"),
             "output_kind must be 'cumulative', 'delta' or 'final_only', got {s.output_kind!r}"),
            (self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
             "structured_outputs must be a StructuredOutputsParams (or a dict of its fields)"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message.format(s=self))

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
