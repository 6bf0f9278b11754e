"""Applying a step's token bitmask to its logits on the device (the sampler then never picks a masked token)."""

from __future__ import annotations

import torch

from railyard.engine.runner.sampler import host_tensor, to_device
from railyard.engine.structured.manager import GrammarBitmask


def apply_bitmask(logits: torch.Tensor, bitmask: GrammarBitmask) -> None:
    """Set the logits of every token a row's grammar forbids to -inf, in place, for the bitmask's rows.

    The mask travels to the device without a stream sync; xgrammar's kernel (Triton on CUDA, C++ on the CPU)
    touches only the listed rows, so unconstrained rows of the batch keep their logits bit for bit. When every
    row is constrained (the usual batch of a constrained workload) no row index is built at all: the host's
    share of the step stays two launches and one copy."""
    import xgrammar as xgr

    every_row = len(bitmask.rows) == logits.shape[0]  # rows are distinct row numbers below logits.shape[0]
    if logits.device.type == "cpu":
        mask, rows = bitmask.tensor, None if every_row else bitmask.rows
    else:
        mask = to_device(bitmask.tensor, logits.device)
        rows = None if every_row else host_tensor(bitmask.rows, torch.int32, logits.device)
    xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=bitmask.vocab_size, indices=rows)
    if logits.shape[-1] > bitmask.vocab_size:  # ids past the tokenizer's: never allowed
        with torch.inference_mode():  # logits made under inference mode may only be written under it
            if rows is None:
                logits[:, bitmask.vocab_size:] = float("-inf")
            else:
                index = rows if isinstance(rows, torch.Tensor) else torch.tensor(rows)
                logits[index.long(), bitmask.vocab_size:] = float("-inf")
