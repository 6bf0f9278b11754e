"""Checks a request must pass before the engine queues it, shared by the front and the engine core.

The front runs them at the door (so a bad request gets its 400 before any response starts, and
nothing is sent to the engine process); the core runs them again, since a sampler that indexes
logits with one bad id would fail the whole batch.
"""

from __future__ import annotations

from railyard.engine.config import SamplingParams
from railyard.errors import InvalidRequestError


def check_prompt_token_ids(ids: list[int], *, vocab_size: int, max_model_len: int) -> None:
    """Integers, inside the vocabulary, not empty, and leaving room for at least one output token."""
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise InvalidRequestError("prompt token ids must be integers")
    if not ids:
        raise InvalidRequestError("the prompt is empty")
    check_in_vocab(ids, vocab_size, "prompt token id")
    if len(ids) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens but max_model_len is {max_model_len}: at most {max_model_len - 1} "
            "prompt tokens fit (one is needed for the output); shorten the prompt")


def check_sampling_params(params: SamplingParams, *, vocab_size: int) -> None:
    """What SamplingParams cannot check alone: stop token ids against this model's vocabulary."""
    check_in_vocab(params.stop_token_ids, vocab_size, "stop token id")


def check_priority(priority: int, scheduling_policy: str | None) -> None:
    """vLLM's rule: a priority other than 0 is refused where nothing would honour it (None: not known here)."""
    if priority and scheduling_policy == "fcfs":
        raise InvalidRequestError(f"priority {priority} needs priority scheduling (--scheduling-policy priority); "
                                  "this engine schedules first come, first served")


def check_in_vocab(ids: list[int], vocab_size: int, what: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"{what} {bad[0]} is outside the vocabulary [0, {vocab_size})")
