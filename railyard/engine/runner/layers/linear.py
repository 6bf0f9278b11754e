"""Linear layers that shard across a tensor-parallel group and load HF weights shard by shard.

Column-parallel layers split output features (QKV by heads, gate/up by columns); row-parallel
layers split input features and all-reduce. Each parameter knows how to take its slice of a
checkpoint tensor (`weight_loader`), so a rank never materialises the whole model.

With quant="fp8" the weight is float8_e4m3fn with one float32 scale per output channel
(`weight_scale`), which shards exactly as a bias would. A high-precision checkpoint tensor is
quantized as it loads, each row's scale taken over the whole row before any slicing, so every
tensor-parallel rank holds the same numbers one process would; an FP8 checkpoint's weights and scales
(per channel, or one per tensor) are copied in as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.runner.layers.fp8 import FP8, ScaledAccumulator, fp8_linear, quantize_rows
from railyard.engine.runner.layers.parallel import SINGLE, ParallelState


def _attach(param: nn.Parameter, loader) -> nn.Parameter:
    param.weight_loader = loader
    return param


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src)


def _check_quant(quant: str | None) -> None:
    if quant not in (None, "fp8"):
        raise ValueError(f"unknown linear-layer quantization {quant!r}")


class _QuantizableWeight:
    """A linear layer's weight: plain, or (quant="fp8") `weight` [out, in] e4m3 and `weight_scale` [out] float32.

    Subclasses say how a checkpoint tensor's rows and columns map onto this rank (`_load`) and how a
    per-output vector (a bias, a scale) does (`_load_vector`); this mixin turns both into FP8 loading. Subclasses
    also hold `lora`, the layer's LoRA slots (None where the engine serves no adapters).
    """

    def _make_weight(self, rows: int, cols: int, quant: str | None, dtype: torch.dtype | None) -> None:
        _check_quant(quant)
        self.quant = quant
        self.fp8_gemm = "auto"  # which tensor-core GEMM (layers/fp8.py, FP8_GEMMS); the model runner sets it
        wdtype = FP8 if quant == "fp8" else dtype
        self.weight = _attach(nn.Parameter(torch.empty(rows, cols, dtype=wdtype), requires_grad=False),
                              self._load_weight if quant else self._load)
        if quant:
            self.weight_scale = _attach(nn.Parameter(torch.empty(rows, dtype=torch.float32), requires_grad=False),
                                        self._load_scale)

    def _load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.dtype == FP8:  # an FP8 checkpoint: its scale arrives as its own tensor
            self._load(param, loaded, shard_id)
            return
        q, scale = quantize_rows(loaded.to(param.device))  # whole rows: the scale of one process, on any rank
        self._load(param, q, shard_id)
        self._load_vector(self.weight_scale, scale, shard_id)

    def _load_scale(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        scale = loaded.to(torch.float32).reshape(-1)
        if scale.numel() == 1:  # one scale for the whole (logical) tensor: every output channel gets it
            scale = scale.expand(self.total_out)
        self._load_vector(param, scale, shard_id)

    def _load_vector(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        raise NotImplementedError

    @property
    def takes_quantized_input(self) -> bool:
        """Whether the layer may be handed a QuantizedActivation (FP8 weights, and no LoRA slots: an adapter reads
        the input unquantized)."""
        return self.quant == "fp8" and self.lora is None

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.quant:
            return fp8_linear(x, self.weight, self.weight_scale, bias, self.fp8_gemm)
        return F.linear(x, self.weight, bias)


class ColumnParallelLinear(_QuantizableWeight, nn.Module):
    """y = x W^T (+ b), output features split over ranks; outputs stay sharded."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None, quant: str | None = None) -> None:
        super().__init__()
        assert out_features % ps.world_size == 0, "output features must divide by tensor_parallel_size"
        self.ps = ps
        self.out_per_rank = out_features // ps.world_size
        self.total_out = out_features
        self._make_weight(self.out_per_rank, in_features, quant, dtype)
        self.bias = _attach(nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype), requires_grad=False),
                            self._load) if bias else None
        self.lora = None  # LoRA adapter slots (layers/lora.py's LoRAWeights) where the engine serves adapters

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = self.out_per_rank
        _copy(param.data, loaded.narrow(0, self.ps.rank * n, n), "column-parallel")

    def _load_vector(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        self._load(param, loaded, shard_id)  # output rows shard alike for weights, biases and scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_forward(x)
        return y if self.lora is None else self.lora.add_to(x, y)

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T (+ b) without the adapters' sums: for a caller that adds them in its next pass (the MLP's
        SiLU-and-mul)."""
        return self._matmul(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (gate/up)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None, quant: str | None = None) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias, ps, dtype, quant)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        ws = self.ps.world_size
        offset = sum(self.out_sizes[:shard_id]) // ws
        n = self.out_sizes[shard_id] // ws
        _copy(param.data.narrow(0, offset, n), loaded.narrow(0, self.ps.rank * n, n), f"merged shard {shard_id}")


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection split by heads; KV heads are replicated when TP exceeds their count."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 ps: ParallelState = SINGLE, dtype: torch.dtype | None = None, quant: str | None = None) -> None:
        ws = ps.world_size
        assert num_heads % ws == 0, "attention heads must divide by tensor_parallel_size"
        assert num_kv_heads % ws == 0 or ws % num_kv_heads == 0, \
            "KV heads and tensor_parallel_size must divide one another"
        self.head_dim = head_dim
        self.num_heads = num_heads // ws
        self.num_kv_heads = max(1, num_kv_heads // ws)
        self.kv_replicas = max(1, ws // num_kv_heads)
        total = (self.num_heads + 2 * self.num_kv_heads) * head_dim * ws
        super().__init__(hidden, total, bias, ps, dtype, quant)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        d, q, kv = self.head_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            dst, start = param.data.narrow(0, 0, q), self.ps.rank * q
        else:
            offset = q if shard_id == "k" else q + kv
            dst, start = param.data.narrow(0, offset, kv), (self.ps.rank // self.kv_replicas) * kv
        _copy(dst, loaded.narrow(0, start, dst.shape[0]), f"qkv shard {shard_id} (head_dim {d})")


class RowParallelLinear(_QuantizableWeight, nn.Module):
    """y = x W^T (+ b), input features split over ranks; partial sums all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ps: ParallelState = SINGLE,
                 dtype: torch.dtype | None = None, quant: str | None = None) -> None:
        super().__init__()
        assert in_features % ps.world_size == 0, "input features must divide by tensor_parallel_size"
        self.ps = ps
        self.in_per_rank = in_features // ps.world_size
        self.total_out = out_features
        self._make_weight(out_features, self.in_per_rank, quant, dtype)
        self.bias = _attach(nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False),
                            self._load_bias) if bias else None
        self.lora = None  # as ColumnParallelLinear's; its sums join the partial output before the all-reduce

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        n = self.in_per_rank
        _copy(param.data, loaded.narrow(1, self.ps.rank * n, n), "row-parallel")

    def _load_bias(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy(param.data, loaded, "row-parallel bias")

    def _load_vector(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy(param.data, loaded, "row-parallel weight scale")  # outputs are not split: every rank has all

    def forward(self, x: torch.Tensor, defer_scales: bool = False) -> torch.Tensor | ScaledAccumulator:
        """defer_scales: the caller feeds the output straight to an RMSNorm, which may then get an FP8 GEMM's
        ScaledAccumulator (fp8_linear) and apply the scales itself; only on one rank without a bias or LoRA slots,
        where nothing (all-reduce, bias add, an adapter's sum) stands between the GEMM and the norm."""
        if defer_scales and self.takes_quantized_input and self.ps.world_size == 1 and self.bias is None:
            return fp8_linear(x, self.weight, self.weight_scale, None, self.fp8_gemm, defer_scales=True)
        # One rank: the bias in the GEMM's epilogue (as nn.Linear adds it); across ranks once, after the all-reduce.
        fused_bias = self.bias if self.ps.world_size == 1 else None
        y = self._matmul(x, fused_bias)
        if self.lora is not None:
            self.lora.add_to(x, y)
        y = self.ps.all_reduce(y)
        return y if self.bias is None or fused_bias is not None else y + self.bias
