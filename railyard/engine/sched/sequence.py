"""One sequence's state machine: WAITING -> RUNNING <-> (PREEMPTED | SWAPPED) -> FINISHED(reason).

A request with n > 1 becomes n sequences that share the prompt (and, through the prefix cache,
its full KV blocks); each is scheduled on its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from railyard.engine.config import SamplingParams
from railyard.engine.lora.request import LoRARequest

# An output token sampled by a step still running on the device (asynchronous scheduling): the next
# step is planned before the value reaches the host, and reads it on the device.
PLACEHOLDER = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks dropped; waits to recompute its tokens
    SWAPPED = "swapped"  # blocks held in the CPU pool
    FINISHED = "finished"


@dataclass
class Sequence:
    """Token state and scheduling state of one generated sequence."""

    seq_id: int
    request_id: str
    index: int  # which of the request's n outputs
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    eos_token_ids: tuple[int, ...] = ()
    status: SequenceStatus = SequenceStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # KV bookkeeping, owned by the block manager.
    block_table: list[int] = field(default_factory=list)
    cpu_block_table: list[int] = field(default_factory=list)
    # The sliding-window layers' blocks, when the model keeps them apart (block_manager.py): NO_BLOCK (-1) where
    # the window has moved past a block.
    sliding_table: list[int] = field(default_factory=list)
    cpu_sliding_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # tokens served from the prefix cache at first admission
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    # Asynchronous scheduling: trailing output tokens still on the device, and the row of the last one
    # in its step's sampled ids.
    num_placeholders: int = 0
    pending_row: int = -1
    lora: LoRARequest | None = None  # the adapter it runs with (None: the base model)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values the host has (all but the placeholders)."""
        return len(self.prompt_token_ids) + self.num_known_output_tokens

    @property
    def num_known_output_tokens(self) -> int:
        return len(self.output_token_ids) - self.num_placeholders

    def reaches_length_limit(self, max_model_len: int) -> bool:
        """Its tokens, placeholders included, reach max_tokens or max_model_len: it stops once they are known."""
        max_tokens = self.params.max_tokens
        return (max_tokens is not None and len(self.output_token_ids) >= max_tokens) \
            or self.num_tokens >= max_model_len

    def token_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
