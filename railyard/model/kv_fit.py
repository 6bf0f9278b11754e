"""Whether a KV cache of N blocks holds one sequence of max_model_len: the engine refuses to start when it does not
(a request it accepted could never run), and the planner says so of a plan before any pod starts. One rule for both,
sliding-window layers included (their blocks: a prefill chunk's run plus the window before it)."""

from __future__ import annotations

from dataclasses import dataclass


def blocks_to_hold(num_tokens: int, max_chunk: int, block_size: int, sliding_window: int | None) -> int:
    """The most blocks one sequence of num_tokens holds at once, prefilled in chunks of at most max_chunk tokens:
    its full blocks, and its sliding blocks (a chunk's whole run plus the window before it)."""
    full = -(-num_tokens // block_size)
    if sliding_window is None:
        return full
    return full + min(full, -(-(sliding_window - 1 + min(max_chunk, num_tokens)) // block_size) + 1)


def longest_context(num_blocks: int, max_chunk: int, block_size: int, sliding_window: int | None) -> int:
    """The longest sequence, in whole blocks of tokens, that num_blocks hold at once: the max_model_len they fit."""
    low, high = 0, num_blocks  # in blocks; blocks_to_hold grows with the length
    while low < high:
        mid = (low + high + 1) // 2
        if blocks_to_hold(mid * block_size, max_chunk, block_size, sliding_window) <= num_blocks:
            low = mid
        else:
            high = mid - 1
    return low * block_size


@dataclass(frozen=True)
class KVShortfall:
    """A KV cache that cannot hold one sequence of max_model_len, and the longest it holds (0: none)."""

    tokens: int
    max_model_len: int
    sliding: bool
    fits: int

    def describe(self) -> str:
        sliding = " (with its sliding-window layers' blocks)" if self.sliding else ""
        return f"the KV cache holds {self.tokens} tokens, fewer than max_model_len {self.max_model_len}{sliding}"


def kv_shortfall(num_blocks: int, block_size: int, max_model_len: int, max_chunk: int,
                 sliding_window: int | None) -> KVShortfall | None:
    """None where num_blocks hold one sequence of max_model_len prefilled in chunks of max_chunk tokens."""
    if num_blocks >= blocks_to_hold(max_model_len, max_chunk, block_size, sliding_window):
        return None
    return KVShortfall(num_blocks * block_size, max_model_len, sliding_window is not None,
                       longest_context(num_blocks, max_chunk, block_size, sliding_window))
