"""Continuous batching under one token budget; knows nothing about models or tensors.

Every step: running sequences first (decodes and unfinished prefill chunks), preempting the
lowest-priority not-yet-scheduled one when blocks run out; then swapped sequences come back;
then waiting ones are admitted (with prefix-cache hits) while blocks, seats and budget last.
A step lists its one-token sequences (decodes) before those with prompt chunks: a mixed step's
attention runs the leading decodes in the decode kernel (attention/triton_backend.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from railyard.engine.sched.block_manager import BlockManager
from railyard.engine.config import EngineConfig
from railyard.engine.lora.request import LoRARequest
from railyard.engine.lora.slots import LoRASlots
from railyard.engine.sched.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    """One sequence's work this step: num_new_tokens from seq.num_computed_tokens on."""

    seq: Sequence
    num_new_tokens: int
    sample: bool  # this chunk reaches the sequence's last token, so a new token is sampled


@dataclass
class SchedulerOutput:
    """What the model runner executes this step, in order: swaps, then the forward pass."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu_block, cpu_block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu_block, gpu_block)
    preempted: list[Sequence] = field(default_factory=list)
    # [LoRA] the device slot of each adapter this step runs ({lora_int_id: slot}), and the adapters to load into
    # their slots before the forward pass
    lora_slots: dict[int, int] = field(default_factory=dict)
    lora_loads: list[tuple[int, LoRARequest]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_out and not self.swap_in


class Scheduler:
    """Decides, each step, which sequences run and how many tokens each computes."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.budget = config.max_num_batched_tokens
        self.chunked = config.enable_chunked_prefill
        # The most prompt tokens one sequence computes per step (chunked prefill); None: the budget's.
        self.chunk_cap = config.long_prefill_token_threshold if self.chunked and config.long_prefill_token_threshold \
            else None
        # The most prompt tokens in all of a step that also carries decodes; None: no such limit.
        self.mixed_prefill_cap = config.max_prefill_tokens_with_decodes \
            if self.chunked and config.max_prefill_tokens_with_decodes else None
        self.priority_mode = config.scheduling_policy == "priority"
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.num_preemptions = 0
        # [LoRA] at most max_loras distinct adapters among the running sequences: each step's fit the device slots
        self.lora_slots = LoRASlots(config.max_loras) if config.enable_lora else None

    # -- queues ----------------------------------------------------------------------------------
    def _key(self, seq: Sequence) -> tuple:
        # Lower priority value runs first (vLLM's convention); FCFS ignores priority.
        return (seq.priority if self.priority_mode else 0, seq.arrival_time, seq.seq_id)

    def _insert(self, queue: list[Sequence], seq: Sequence) -> None:
        keys = [self._key(s) for s in queue]
        queue.insert(bisect.bisect(keys, self._key(seq)), seq)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self._insert(self.waiting, seq)

    def abort(self, seq: Sequence) -> None:
        self._remove(seq)
        self.bm.free(seq)
        seq.finish("abort")

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that has just finished (status already set).

        Usually it is running; under asynchronous scheduling it may have been preempted (waiting or
        swapped) by the step planned while its last token was on the device."""
        self._remove(seq)
        self.bm.free(seq)

    def _remove(self, seq: Sequence) -> None:
        """Take seq out of whichever queue holds it (at most one)."""
        for queue in (self.running, self.waiting, self.swapped):
            if seq in queue:
                queue.remove(seq)
                return

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def live(self) -> list[Sequence]:
        return self.waiting + self.running + self.swapped

    # -- one step --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.budget
        # Prompt tokens (prefill chunks, recomputes) this step may still take: capped while decodes run.
        prefill_left = self.mixed_prefill_cap if self.mixed_prefill_cap and any(map(_is_decoding, self.running)) \
            else budget
        i = 0
        # A prompt chunk scheduled ahead of a decode (priority order, a recompute, a chunked prompt) reorders the step.
        prompt_seen = reorder = False
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_placeholders and seq.reaches_length_limit(self.max_model_len):
                i += 1  # finishes once its token in flight arrives: another step would be wasted
                continue
            prefill = not _is_decoding(seq)
            if prefill and prefill_left <= 0:
                i += 1  # its next chunk waits for a step with prefill room
                continue
            num_new = self._chunk(seq.num_uncomputed_tokens, min(budget, prefill_left) if prefill else budget)
            if self._make_room(seq, num_new, i, out):
                out.scheduled.append(ScheduledSequence(seq, num_new,
                                                       seq.num_computed_tokens + num_new == seq.num_tokens))
                budget -= num_new
                if prefill:
                    prefill_left -= num_new
                if num_new > 1:
                    prompt_seen = True
                elif prompt_seen:
                    reorder = True
                i += 1
        if not out.preempted:  # (a step that preempted, blocks being short, admits nothing new)
            resumed = len(out.scheduled)
            budget = self._schedule_swapped(out, budget)
            reorder = reorder or prompt_seen and len(out.scheduled) > resumed  # resumed sequences may decode
            if not self.swapped and prefill_left > 0:
                self._schedule_waiting(out, min(budget, prefill_left))
        if reorder:  # decodes first (stable): attention runs them in the decode kernel, the prompts after them
            out.scheduled.sort(key=_carries_prompt)
        if self.lora_slots is not None:
            out.lora_slots, out.lora_loads = self.lora_slots.assign(
                (item.seq.lora for item in out.scheduled if item.seq.lora is not None), self._running_loras())
        return out

    def _running_loras(self) -> set[int]:
        """[LoRA] the adapters of the running sequences (empty where the engine serves none)."""
        if self.lora_slots is None:
            return set()
        return {seq.lora.lora_int_id for seq in self.running if seq.lora is not None}

    def _lora_fits(self, seq: Sequence, running_loras: set[int]) -> bool:
        """[LoRA] seq may join the running sequences without more distinct adapters than device slots."""
        return (seq.lora is None or self.lora_slots is None or seq.lora.lora_int_id in running_loras
                or len(running_loras) < self.lora_slots.num_slots)

    def _chunk(self, num_uncomputed: int, budget: int) -> int:
        """How many of a sequence's uncomputed tokens this step computes: what the budget and the chunk cap allow."""
        num_new = min(num_uncomputed, budget)
        return min(num_new, self.chunk_cap) if self.chunk_cap else num_new

    def _make_room(self, seq: Sequence, num_new: int, first_unscheduled: int, out: SchedulerOutput) -> bool:
        """Allocate slots for seq, preempting lowest-priority unscheduled sequences as needed."""
        while not self.bm.allocate_slots(seq, num_new):
            victim = max(self.running[first_unscheduled:], key=self._key)
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.num_preemptions += 1
        seq.num_preemptions += 1
        out.preempted.append(seq)
        if self.config.preemption_mode == "swap" and self.bm.can_swap_out(seq):
            out.swap_out.extend(self.bm.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self._insert(self.swapped, seq)
        else:
            # Recompute: drop the KV; the tokens so far (prompt + output) are prefilled again later.
            self.bm.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.PREEMPTED
            self._insert(self.waiting, seq)

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        loras, i = self._running_loras(), 0
        while i < len(self.swapped) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[i]
            if not self._lora_fits(seq, loras):
                i += 1  # its adapter waits for a free slot; others may go first
                continue
            num_new = self._chunk(seq.num_uncomputed_tokens, budget)
            if not self.bm.can_swap_in(seq, num_new):
                break
            self.swapped.pop(i)
            if seq.lora is not None:
                loras.add(seq.lora.lora_int_id)
            out.swap_in.extend(self.bm.swap_in(seq))
            if not self.bm.allocate_slots(seq, num_new):
                raise RuntimeError("swap-in reserved too few blocks")
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new, seq.num_computed_tokens + num_new == seq.num_tokens))
            budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        loras, i = self._running_loras(), 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[i]
            if not self._lora_fits(seq, loras):
                i += 1  # its adapter waits for a free slot; others may go first (as vLLM skips it)
                continue
            cached = self.bm.find_cached_prefix(seq)
            num_cached = len(cached) * self.bm.block_size
            remaining = seq.num_tokens - num_cached
            if remaining > budget and not self.chunked:
                break
            num_new = self._chunk(remaining, budget)
            if not self.bm.admit(seq, cached, num_cached + num_new):
                break
            self.waiting.pop(i)
            if seq.lora is not None:
                loras.add(seq.lora.lora_int_id)
            if seq.num_preemptions == 0:
                self.bm.record_prefix_lookup(seq.num_prompt_tokens, num_cached)
                seq.num_cached_prompt_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            if self.priority_mode:
                self._insert(self.running, seq)
            else:
                self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new, num_cached + num_new == seq.num_tokens))
            budget -= num_new

    # -- after the model ran ---------------------------------------------------------------------
    def mark_computed(self, out: SchedulerOutput) -> None:
        """Advance computed-token counts and publish newly full blocks to the prefix cache."""
        bs, caching = self.bm.block_size, self.bm.enable_prefix_caching
        for item in out.scheduled:
            seq = item.seq
            before = seq.num_computed_tokens
            seq.num_computed_tokens = after = before + item.num_new_tokens
            if caching and after // bs > before // bs:  # a block filled up
                self.bm.cache_full_blocks(seq)


def _carries_prompt(item: ScheduledSequence) -> bool:
    return item.num_new_tokens > 1


def _is_decoding(seq: Sequence) -> bool:
    """Whether a running sequence's next work is one decode token (not a prompt chunk or a recompute)."""
    return seq.num_computed_tokens > 0 and seq.num_uncomputed_tokens <= 1
