"""Seeded synthetic workloads: prompt token ids of random lengths, output lengths."""

from __future__ import annotations

import random
from dataclasses import dataclass

from railyard.errors import ConfigError


# Above this share of prompt tokens served from the prefix cache, a workload without shared prefixes is being
# served prompts the engine has already seen (a second run with the same seed against one server): its
# throughput then measures the cache, not prefill.
REUSED_WORKLOAD_HIT_RATE = 0.2


def reuse_warning(hit_rate: float | None, shared_prefixes: bool) -> str | None:
    """A warning when a workload without shared prefixes was largely served from the prefix cache, else None."""
    if hit_rate is None or shared_prefixes or hit_rate <= REUSED_WORKLOAD_HIT_RATE:
        return None
    return (f"{100 * hit_rate:.0f}% of the prompt tokens came from the prefix cache, but this workload shares no "
            "prefixes: the engine had seen these prompts before (a run with the same seed), and the throughput "
            "above skipped their prefill. Give each run its own seed")


@dataclass(frozen=True)
class LengthRange:
    """A fixed length ("256") or an inclusive range ("100-1024") drawn uniformly."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str | int) -> "LengthRange":
        try:
            if isinstance(text, int):
                low = high = text
            elif "-" in text:
                a, b = text.split("-", 1)
                low, high = int(a), int(b)
            else:
                low = high = int(text)
        except ValueError:
            raise ConfigError(f"length {text!r} must be N or LOW-HIGH (e.g. 256 or 100-1024)") from None
        if low < 1 or high < low:
            raise ConfigError(f"length range {text!r} must have 1 <= LOW <= HIGH")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        # A fixed length draws nothing, so the token stream matches peers' generators (hf_baseline.py).
        return self.low if self.low == self.high else rng.randint(self.low, self.high)


@dataclass
class Request:
    prompt_token_ids: list[int]
    output_len: int


def synthetic_requests(num: int, input_len: LengthRange, output_len: LengthRange, vocab_size: int,
                       seed: int = 0, reserved_low: int = 0, reserved_high: int = 0,
                       tokens_seed: int | None = None) -> list[Request]:
    """num requests with random token ids in [reserved_low, vocab_size - reserved_high) and seeded lengths.
    tokens_seed: the same lengths as `seed` gives, other token ids (a repeat of a workload that shares no prefix
    with it, for runs compared with each other)."""
    rng = random.Random(seed)
    hi = max(0, vocab_size - 1 - reserved_high)
    lo = min(reserved_low, hi)
    reqs = [Request([rng.randint(lo, hi) for _ in range(input_len.draw(rng))], output_len.draw(rng))
            for _ in range(num)]
    if tokens_seed is not None:
        tokens = random.Random(tokens_seed)
        reqs = [Request([tokens.randint(lo, hi) for _ in r.prompt_token_ids], r.output_len) for r in reqs]
    return reqs
