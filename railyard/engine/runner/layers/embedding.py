"""Vocabulary-parallel embedding and LM head: each rank holds a slice of the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.runner.layers.parallel import SINGLE, ParallelState


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.ps = ps
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // ps.world_size)
        self.start = ps.rank * self.per_rank
        self.weight = nn.Parameter(torch.zeros(self.per_rank, dim, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self._load

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows = loaded[self.start:self.start + self.per_rank]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.ps.world_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mask = (local >= 0) & (local < self.per_rank)
        out = F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * mask.unsqueeze(-1).to(self.weight.dtype)
        return self.ps.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the vocabulary; each rank computes its slice, then they are gathered."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = F.linear(hidden, self.weight)
        out = self.ps.all_gather_last_dim(out)
        return out[..., : self.vocab_size]
