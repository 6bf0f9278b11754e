"""Linear layers that shard across a tensor-parallel group and load HF weights shard by shard.

Column-parallel layers split output features (QKV by heads, gate/up by columns); row-parallel
layers split input features and all-reduce. Each parameter knows how to take its slice of a
checkpoint tensor (`weight_loader`), so a rank never materialises the whole model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.parallel import SINGLE, ParallelState


def _attach(param: nn.Parameter, loader) -> nn.Parameter:
    param.weight_loader = loader
    return param


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src)


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), output features split over ranks; outputs stay sharded."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        assert out_features % ps.world_size == 0, "output features must divide by tensor_parallel_size"
        self.ps = ps
        self.out_per_rank = out_features // ps.world_size
        self.weight = _attach(nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype),
                                           requires_grad=False), self._load)
        self.bias = _attach(nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype), requires_grad=False),
                            self._load) if bias else None

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = self.out_per_rank
        _copy(param.data, loaded.narrow(0, self.ps.rank * n, n), "column-parallel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (gate/up)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias, ps, dtype)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        ws = self.ps.world_size
        offset = sum(self.out_sizes[:shard_id]) // ws
        n = self.out_sizes[shard_id] // ws
        _copy(param.data.narrow(0, offset, n), loaded.narrow(0, self.ps.rank * n, n), f"merged shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection split by heads; KV heads are replicated when TP exceeds their count."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 ps: ParallelState = SINGLE, dtype: torch.dtype | None = None) -> None:
        ws = ps.world_size
        assert num_heads % ws == 0, "attention heads must divide by tensor_parallel_size"
        assert num_kv_heads % ws == 0 or ws % num_kv_heads == 0, \
            "KV heads and tensor_parallel_size must divide one another"
        self.head_dim = head_dim
        self.num_heads = num_heads // ws
        self.num_kv_heads = max(1, num_kv_heads // ws)
        self.kv_replicas = max(1, ws // num_kv_heads)
        total = (self.num_heads + 2 * self.num_kv_heads) * head_dim * ws
        super().__init__(hidden, total, bias, ps, dtype)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        d, q, kv = self.head_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            dst, start = param.data.narrow(0, 0, q), self.ps.rank * q
        else:
            offset = q if shard_id == "k" else q + kv
            dst, start = param.data.narrow(0, offset, kv), (self.ps.rank // self.kv_replicas) * kv
        _copy(dst, loaded.narrow(0, start, dst.shape[0]), f"qkv shard {shard_id} (head_dim {d})")


class RowParallelLinear(nn.Module):
    """y = x W^T (+ b), input features split over ranks; partial sums all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        assert in_features % ps.world_size == 0, "input features must divide by tensor_parallel_size"
        self.ps = ps
        self.in_per_rank = in_features // ps.world_size
        self.weight = _attach(nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype),
                                           requires_grad=False), self._load)
        self.bias = _attach(nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False),
                            self._load_bias) if bias else None

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = self.in_per_rank
        _copy(param.data, loaded.narrow(1, self.ps.rank * n, n), "row-parallel")

    def _load_bias(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy(param.data, loaded, "row-parallel bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        y = self.ps.all_reduce(y)
        return y if self.bias is None else y + self.bias
