"""Engine options as command-line flags, derived from EngineConfig so the two never drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from railyard.engine.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, EngineConfig

_HELP = {
    "model": "local HF checkpoint directory, or the embedded model's name (default: tiny-qwen2-seed0, the "
             "embedded tiny model)",
    "tokenizer": "directory of the tokenizer to use (default: the checkpoint's own)",
    "dtype": "weights and activations: auto, float32, bfloat16 or float16 (auto: the checkpoint's, float32 on CPU)",
    "device": "auto, cpu or cuda (auto: cuda when present)",
    "block_size": "tokens per KV-cache block (8, 16 or 32)",
    "max_num_seqs": "most sequences in one batch",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes) (default: "
                              f"max({DEFAULT_MAX_NUM_BATCHED_TOKENS}, --max-num-seqs) with chunked prefill, else "
                              "max(--max-model-len, --max-num-seqs))",
    "long_prefill_token_threshold": "with chunked prefill, most prompt tokens of one request per step (0: off)",
    "max_prefill_tokens_with_decodes": "with chunked prefill, most prompt tokens in all per step while the step "
                                       "also runs decodes: bounds inter-token gaps under arriving prompts (0: off)",
    "max_model_len": "longest prompt + output, in tokens (default: the model's max_position_embeddings)",
    "gpu_memory_utilization": "fraction of GPU memory this engine may use",
    "num_gpu_blocks": "KV blocks to allocate (default: as many as --gpu-memory-utilization leaves room for)",
    "swap_space": "GiB of CPU memory for swap-mode preemption",
    "num_cpu_blocks": "CPU swap blocks to allocate (default: as many as --swap-space holds)",
    "enable_prefix_caching": "reuse the KV blocks of prompt prefixes already computed",
    "enable_chunked_prefill": "split long prompts over several steps, sharing them with decodes",
    "preemption_mode": "what happens to a preempted sequence's KV: recompute or swap",
    "scheduling_policy": "fcfs or priority (requests' priority field: lower runs first)",
    "tensor_parallel_size": "GPUs (processes) per replica",
    "tp_timeout_s": "seconds a tensor-parallel collective waits for a peer before the engine reports the group dead",
    "torch_threads": "torch's intra-op threads in the engine process (default: every core but one on the CPU, "
                     "torch's own on a GPU)",
    "attention_backend": "auto, torch or triton (auto: triton on GPU, torch on CPU)",
    "enforce_eager": "never capture CUDA graphs",
    "quantization": "fp8: FP8 weights (per-channel scales) and per-token FP8 activations; FP8 checkpoints are "
                    "detected from config.json",
    "fp8_gemm": "with FP8 weights on FP8 tensor cores: auto (by the GEMM's shape: cublaslt-fast for decode-sized "
                "GEMMs the row-wise kernel would not spread over the GPU, else rowwise-fast), rowwise (torch's "
                "row-wise scaled _scaled_mm), rowwise-fast (the same with FP8 fast accumulation), cublaslt (an "
                "unscaled cuBLASLt GEMM, scales after), cublaslt-fast (the same with fast accumulation) or triton",
    "kv_cache_dtype": "auto (the model dtype), bfloat16 or fp8 (e4m3, per-layer K/V scales: twice the blocks of bf16)",
    "structured_outputs_disable_any_whitespace": "constrained JSON gets no whitespace beyond ', ' and ': ' unless "
                                                 "a request's structured_outputs.disable_any_whitespace says otherwise",
    "async_scheduling": "plan the next step while the device runs the current one (--no-async-scheduling: "
                        "one step at a time)",
    "cuda_graph_max_batch_size": "largest decode batch captured as a CUDA graph",
    "piecewise_cuda_graphs": "steps with prefill tokens replay CUDA graphs of all but attention "
                             "(--no-piecewise-cuda-graphs: they run eagerly; pure decode steps keep their graphs)",
    "reasoning_parser": "how chat completions find reasoning (vLLM's names): qwen3 (<think> blocks), openai_gptoss "
                        "(gpt-oss's harmony channels), none, or auto (by the chat template)",
    "tool_call_parser": "how chat completions find tool calls under tool_choice auto (vLLM's names): hermes "
                        "(<tool_call> JSON blocks), openai (gpt-oss's harmony), or auto (by the chat template)",
    "enable_lora": "serve LoRA adapters (PEFT format) beside the base model",
    "max_loras": "LoRA adapters resident on the device at once (distinct adapters in one step)",
    "max_lora_rank": "the largest LoRA rank an adapter may have (at most 64)",
    "max_cpu_loras": "LoRA adapters kept in host memory (default: --max-loras)",
    "enable_sleep_mode": "allow sleep(level) and wake_up(): give the device memory of the KV cache, the CUDA graphs "
                         "and the weights back while the engine keeps its process (level 1: weights in pinned host "
                         "memory; level 2: read from the checkpoint again on wake-up)",
    "seed": "seed of the random weights a named model shape gets (benchmarks)",
}
_SKIP = {"served_model_name"}
_FLAGS = {"seed": "--engine-seed"}  # --seed is the per-request sampling seed where both appear


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add one --flag per EngineConfig field (booleans get --flag / --no-flag)."""
    group = parser.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in _SKIP:
            continue
        flag = _FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        hint = hints[f.name]
        kind = _base_type(hint)
        help_text = _with_default(_HELP.get(f.name, f.name.replace("_", " ")), f.default)
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
            group.add_argument(flag, dest=f.name, type=str if choices else kind, choices=choices, default=None,
                               help=help_text)


def _with_default(help_text: str, default) -> str:
    """The help with EngineConfig's default (the flags themselves default to None: only given ones override)."""
    if "(default:" in help_text:
        return help_text
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{help_text} (default: {shown})"


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    """EngineConfig from parsed flags: only flags the user gave override the defaults."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
              if getattr(args, f.name, None) is not None}
    values.update(overrides)
    if not values.get("model"):
        from railyard.engine.startup.tiny_model import ensure_tiny_model

        values["model"] = str(ensure_tiny_model())
    return EngineConfig(**values)


def _base_type(hint) -> type:
    if typing.get_origin(hint) is typing.Literal:
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:
        return _base_type(args[0])
    return hint
