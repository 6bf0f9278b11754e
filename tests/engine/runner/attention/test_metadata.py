"""AttentionMetadata tells a mixed step's leading decodes apart from the sequences that carry prompts."""

from __future__ import annotations

import torch

from railyard.engine.runner.attention.metadata import AttentionMetadata


def _meta(new: list[int], seq_lens: list[int]) -> AttentionMetadata:
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long), query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(seq_lens), block_tables=torch.zeros((len(new), 1), dtype=torch.int32),
        max_query_len=max(new), max_seq_len=max(seq_lens), query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)


def test_leading_one_token_sequences_are_the_decodes():
    meta = _meta([1, 1, 1, 40, 1], [90, 700, 12, 40, 3000])
    assert meta.num_decodes == 3
    assert meta.decode_max_seq_len == 700  # the decode behind the prompt is the prefill kernel's


def test_a_step_that_starts_with_a_prompt_has_no_decodes_apart():
    meta = _meta([17, 1, 1], [17, 50, 60])
    assert meta.num_decodes == 0
    assert meta.decode_max_seq_len == 0


def test_a_decode_only_step_is_all_decodes():
    meta = _meta([1, 1], [5, 8])
    assert meta.decode_only and meta.num_decodes == 2 and meta.decode_max_seq_len == 8
