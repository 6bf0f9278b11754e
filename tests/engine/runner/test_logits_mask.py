"""Masking a step's logits: ids past the tokenizer's (a model vocabulary padded beyond it, as the GPU shapes'
is) are forbidden in constrained rows, also on logits made under inference mode, as the engine's are."""

from __future__ import annotations

import torch

from railyard.engine.runner.logits_mask import apply_bitmask
from railyard.engine.structured.manager import GrammarBitmask


def test_ids_past_the_tokenizer_are_forbidden_in_masked_rows_of_inference_logits():
    tokenizer_vocab, model_vocab = 40, 64
    with torch.inference_mode():
        logits = torch.randn(3, model_vocab)
    allowed = torch.full((3, (tokenizer_vocab + 31) // 32), -1, dtype=torch.int32)  # every tokenizer id allowed
    before = logits.clone()
    apply_bitmask(logits, GrammarBitmask(allowed, [1], tokenizer_vocab))
    assert torch.isinf(logits[1, tokenizer_vocab:]).all() and torch.equal(logits[1, :tokenizer_vocab],
                                                                          before[1, :tokenizer_vocab])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])  # unconstrained rows untouched


def test_a_batch_of_only_constrained_rows_is_masked_row_by_row_as_with_indices():
    tokenizer_vocab, model_vocab = 40, 64
    with torch.inference_mode():
        logits = torch.randn(3, model_vocab)
    allowed = torch.randint(-2**31, 2**31 - 1, (3, (tokenizer_vocab + 31) // 32), dtype=torch.int32)
    every_row, one_by_one = logits.clone(), logits.clone()
    apply_bitmask(every_row, GrammarBitmask(allowed, [0, 1, 2], tokenizer_vocab))  # no row index: the fast path
    for row in range(3):  # the oracle: each row masked alone through the indexed path
        apply_bitmask(one_by_one, GrammarBitmask(allowed, [row], tokenizer_vocab))
    assert torch.equal(every_row, one_by_one)
    assert torch.isinf(every_row[:, tokenizer_vocab:]).all()
