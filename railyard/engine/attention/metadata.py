"""What every attention layer needs to find a step's keys and values in the paged cache."""

from __future__ import annotations

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

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1
