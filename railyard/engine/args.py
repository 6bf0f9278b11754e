"""Engine options as command-line flags, derived from EngineConfig so the two never drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from railyard.engine.config import EngineConfig

_HELP = {
    "model": "local HF checkpoint directory (default: the embedded tiny model)",
    "block_size": "tokens per KV-cache block (8, 16 or 32)",
    "max_num_seqs": "most sequences in one batch",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes)",
    "max_model_len": "longest prompt + output, in tokens (default: the model's)",
    "gpu_memory_utilization": "fraction of GPU memory this engine may use",
    "num_gpu_blocks": "KV blocks to allocate (overrides memory profiling)",
    "swap_space": "GiB of CPU memory for swap-mode preemption",
    "preemption_mode": "what happens to a preempted sequence's KV: recompute or swap",
    "scheduling_policy": "fcfs or priority",
    "tensor_parallel_size": "GPUs (processes) per replica",
    "quantization": "fp8: FP8 weights (per-channel scales) and per-token FP8 activations; FP8 checkpoints are "
                    "detected from config.json",
    "kv_cache_dtype": "auto (the model dtype), bfloat16 or fp8 (e4m3, per-layer K/V scales: twice the blocks of bf16)",
    "structured_outputs_disable_any_whitespace": "constrained JSON gets no whitespace beyond ', ' and ': ' unless "
                                                 "a request's structured_outputs.disable_any_whitespace says otherwise",
    "async_scheduling": "plan the next step while the device runs the current one (--no-async-scheduling: "
                        "one step at a time)",
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
        help_text = _HELP.get(f.name)
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
            group.add_argument(flag, dest=f.name, type=str if choices else kind, choices=choices, default=None,
                               help=help_text)


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    """EngineConfig from parsed flags: only flags the user gave override the defaults."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
              if getattr(args, f.name, None) is not None}
    values.update(overrides)
    if not values.get("model"):
        from railyard.engine.tiny_model import ensure_tiny_model

        values["model"] = str(ensure_tiny_model())
    return EngineConfig(**values)


def _base_type(hint) -> type:
    if typing.get_origin(hint) is typing.Literal:
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:
        return _base_type(args[0])
    return hint
