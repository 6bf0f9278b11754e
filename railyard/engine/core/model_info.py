"""`ModelInfo`: what a front needs to know of the model an engine serves (its limits, its tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from railyard.engine.lora.request import LoRARequest
from railyard.engine.startup.timings import StartupTimes


@dataclass
class ModelInfo:
    """The served model's facts and limits, as the engine core resolved them at start-up."""

    model: str  # the checkpoint directory or named shape the engine was started with
    served_model_name: str
    tokenizer: str | None  # where the front loads its tokenizer from (None: token ids only)
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    # One engine's sizing (0 where a front stands for several engines, as a Ray fleet's does).
    block_size: int = 16
    num_gpu_blocks: int = 0
    num_cpu_blocks: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    tensor_parallel_size: int = 1
    scheduling_policy: str | None = None  # None where a front stands for several engines
    # The chat endpoint's parsers as configured (EngineConfig's names; "auto": by the chat template).
    reasoning_parser: str = "auto"
    tool_call_parser: str = "auto"
    created: int = 0  # the checkpoint's mtime (the OpenAI model card's "created")
    pids: list[int] = field(default_factory=list)  # the engine core's process and its tensor-parallel workers
    startup: StartupTimes | None = None  # where one engine's start-up time went (None for a fleet)
    # [LoRA] the adapters loaded now (a request's `model` may name one), and the limits of the ones it may load;
    # max_loras 0: the engine serves no adapters
    loras: list[LoRARequest] = field(default_factory=list)
    max_loras: int = 0
    max_lora_rank: int = 0
