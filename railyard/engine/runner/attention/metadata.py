"""What every attention layer needs to find a step's keys and values in the paged cache."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Built once per step by the model runner and passed explicitly down the model."""

    slot_mapping: torch.Tensor  # [T] flat cache slot for each new token
    query_start_loc: torch.Tensor  # [B+1] int32 offsets of each sequence's new tokens
    seq_lens: torch.Tensor  # [B] int32 context length after this step (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # The same step as the sliding-window layers see it, when their KV sits in blocks of their own (their slots and
    # block tables; engine/sched/block_manager.py); None: they use these. Backends with a window switch to it.
    sliding: AttentionMetadata | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1

    @functools.cached_property
    def num_decodes(self) -> int:
        """How many sequences at the front of the batch have one new token each.

        A mixed step runs them through the decode kernel, and only the rest through the prefill kernel. The
        scheduler lists a step's decodes first. Computed once per step, on first use, from the host offsets."""
        starts = self.query_start_loc_cpu
        n = 0
        while n + 1 < len(starts) and starts[n + 1] - starts[n] == 1:
            n += 1
        return n

    @functools.cached_property
    def decode_max_seq_len(self) -> int:
        """The longest context among the leading decodes (sizes the decode kernel's context splits)."""
        return max(self.seq_lens_cpu[:self.num_decodes], default=0)

    @functools.cached_property
    def split(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(block tables, seq lens) of the leading decodes and (block tables, seq lens, query starts) of the rest,
        sliced once per step rather than once per layer."""
        nd = self.num_decodes
        return ((self.block_tables[:nd], self.seq_lens[:nd]),
                (self.block_tables[nd:], self.seq_lens[nd:], self.query_start_loc[nd:]))
