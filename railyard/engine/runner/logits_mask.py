"""Applying a step's token bitmask to its logits on the device (the sampler then never picks a masked token)."""

from __future__ import annotations

import torch

from railyard.engine.runner.sampler import host_tensor, to_device
from railyard.engine.startup.jit_watch import starting
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


def warm_up_bitmask(vocab_size: int, *, model_vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Apply a mask once for each kind of batch the step loop will meet (one row, a multiple of 16 rows, neither;
    every row constrained or some), so its kernel's specialisations are compiled before the first constrained row
    is sampled. Called on the grammar thread once the tokenizer, and with it the masks' width, is known; runs on
    a stream of its own, as start-up work (jit_watch). Nothing to do off CUDA."""
    if device.type != "cuda":
        return
    with starting(), torch.inference_mode():
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            for rows in (1, 2, 16):
                mask = torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)
                for batch in (rows, rows + 1):
                    logits = torch.zeros((batch, model_vocab_size), dtype=dtype, device=device)
                    apply_bitmask(logits, GrammarBitmask(mask, list(range(rows)), vocab_size))
        stream.synchronize()
