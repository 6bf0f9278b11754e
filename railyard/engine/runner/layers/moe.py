"""Mixture-of-experts layer: a router picks each token's top-k experts, the experts' MLPs run on the tokens routed to
them, and a token's output is the routing-weighted sum of its experts' outputs.

The experts' weights are stacked, one tensor per projection: w13 [E, 2I, H] (gate rows, then up rows: silu(gate)
* up, the dense MLP's fused gate/up) and w2 [E, H, I], where I is this tensor-parallel rank's slice of every
expert's intermediate width (the dense MLP's split: gate/up by output rows, down by input columns; the partial sums
are all-reduced once, after the weighted sum). A checkpoint's per-expert tensors are copied into their slot of the
stack as they load (expert_loader): no second copy is kept.

Two paths with one contract, experts(x, topk_weights, topk_ids) -> [T, H]:
- the reference (CPU, and the oracle of the kernel): tokens grouped by expert, one matmul pair per expert hit, in
  ascending expert order as HF transformers sums them;
- the fused GPU path (kernels/fused_moe.py): tokens sorted by expert with block-aligned padding, one grouped GEMM
  per projection, routing weights applied in the down GEMM's epilogue, fixed shapes for a given token count (no
  host sync), so it runs under the decode and piecewise CUDA graphs.

Hooks for other MoE families: biases per expert (w13_bias [E, 2I], w2_bias [E, H], added before the routing weight
multiplies), and the activation between the two projections, any function [n, 2I] -> [n, I] (silu_and_mul for
Qwen; gpt-oss passes its clamped SwiGLU on interleaved gate/up).
FP8 experts (quant="fp8"): e4m3 weights with one float32 scale per EXPERT_BLOCK (128 x 128) of each expert's
projection, as FP8 MoE checkpoints ship them (layers/fp8_block.py).
MXFP4 experts (quant="mxfp4", gpt-oss): each row's e2m1 pairs packed in bytes (w13 [E, 2I, H/2], w2 [E, H, I/2])
with one uint8 exponent per 32 weights (w13_weight_scale [E, 2I, H/32], w2_weight_scale [E, H, I/32]), as the
checkpoints ship them (layers/mxfp4.py): the reference path widens one expert at a time as it runs; the fused kernel
reads the packed tiles and widens them in registers (no widened copy anywhere). On a GPU the bytes are put in the
kernel's order within each 32-weight group once they are filled (weights_filled; layers/mxfp4.py). Tensor parallel
ranks split the intermediate width by whole 32-weight groups (an exponent's span), so gpt-oss's 2880 (90 groups)
splits over 4 ranks as 23, 23, 23 and 21 groups: every rank holds the same padded width, the last ones' extra
columns zero (zero gate/up rows and biases, zero down columns: they add nothing), as vLLM pads it (model/spec.py's
expert_shard).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.runner.layers.activation import silu_and_mul
from railyard.engine.runner.layers.fp8 import FP8
from railyard.engine.runner.layers.mxfp4 import (GROUP as MXFP4_GROUP, dequantize_mxfp4, from_kernel_layout,
                                                 to_kernel_layout)
from railyard.engine.runner.layers.fp8_block import (block_scale_shape, dequantize_blocks,
                                                     dequantize_per_token_group, quantize_blocks,
                                                     quantize_per_token_group)
from railyard.engine.runner.layers.parallel import SINGLE, ParallelState
from railyard.model.spec import EXPERT_BLOCK, expert_shard

Activation = Callable[[torch.Tensor], torch.Tensor]


def route_softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64): softmax in float32,
    top-k, renormalised to sum 1 when `renormalize` (Qwen's norm_topk_prob), as HF transformers' Qwen3-MoE."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def route_topk_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64): the top-k logits,
    then a softmax over those k alone, as HF transformers' gpt-oss."""
    top, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top, dim=-1), ids


def on_device(route: Callable[..., tuple[torch.Tensor, torch.Tensor]],
              logits: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """One of this module's routing functions as logits' device runs it: the fused kernel of the same name on the GPU
    (kernels/moe_routing.py, one launch), else the torch definition itself."""
    ops = moe_ops() if logits.is_cuda else None
    return route if ops is None else getattr(ops, route.__name__)


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, activation: Activation = silu_and_mul,
                      w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]) for every token t, in plain torch: tokens grouped by
    expert, one gate/up and one down matmul per expert hit, summed in ascending expert order (HF's order)."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros_like(x)
    if num_tokens == 0:
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()  # host sync: the reference path only
    weights = topk_weights.reshape(-1)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        slots = order[start:start + n]
        start += n
        tokens = slots // top_k
        h = F.linear(x[tokens], w13[expert], None if w13_bias is None else w13_bias[expert])
        y = F.linear(activation(h), w2[expert], None if w2_bias is None else w2_bias[expert])
        out.index_add_(0, tokens, y * weights[slots, None].to(y.dtype))
    return out


def experts_reference_fp8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                          w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                          activation: Activation = silu_and_mul, w13_bias: torch.Tensor | None = None,
                          w2_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The FP8 experts' reference: the same quantized numbers as the kernel (block-scaled weights, activations
    quantized per token and 128-wide group), dequantized to x's dtype and multiplied by experts_reference."""

    def fake_quant(a: torch.Tensor) -> torch.Tensor:
        return dequantize_per_token_group(*quantize_per_token_group(a), a.dtype)

    w13_f = dequantize_blocks(w13, w13_scale, x.dtype, split=w13.shape[-2] // 2)
    w2_f = dequantize_blocks(w2, w2_scale, x.dtype)
    return experts_reference(fake_quant(x), w13_f, w2_f, topk_weights, topk_ids,
                             lambda h: fake_quant(activation(h)), w13_bias, w2_bias)


class FusedMoE(nn.Module):
    """One MoE layer's experts on this rank: stacked weights, their checkpoint loaders, and the forward pass given
    the routing. forward returns this rank's partial sums; the caller all-reduces once (reduce=False) or lets the
    layer do it (reduce=True)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, ps: ParallelState = SINGLE,
                 bias: bool = False, activation: Activation = silu_and_mul, quant: str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if quant not in (None, "fp8", "mxfp4"):
            raise ValueError(f"unknown expert quantization {quant!r}")
        assert quant == "mxfp4" or intermediate_size % ps.world_size == 0, \
            "expert intermediate size must divide by tensor_parallel_size"
        self.ps, self.quant, self.activation = ps, quant, activation
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        # this rank's slice of each expert: MXFP4's in whole groups, padded to the same width on every rank
        self.shard = expert_shard(intermediate_size, ps.world_size, ps.rank, MXFP4_GROUP if quant == "mxfp4" else 1)
        self.inter = self.shard.held
        if quant == "mxfp4":
            self.w13_weight = self._param((num_experts, 2 * self.inter, hidden_size // 2), torch.uint8)
            self.w2_weight = self._param((num_experts, hidden_size, self.inter // 2), torch.uint8)
            self.w13_weight_scale = self._param((num_experts, 2 * self.inter, hidden_size // MXFP4_GROUP), torch.uint8)
            self.w2_weight_scale = self._param((num_experts, hidden_size, self.inter // MXFP4_GROUP), torch.uint8)
        else:
            wdtype = FP8 if quant == "fp8" else dtype
            self.w13_weight = self._param((num_experts, 2 * self.inter, hidden_size), wdtype)
            self.w2_weight = self._param((num_experts, hidden_size, self.inter), wdtype)
        if quant == "fp8":
            self.w13_weight_scale = self._param(
                (num_experts, *block_scale_shape(2 * self.inter, hidden_size, self.inter)), torch.float32)
            self.w2_weight_scale = self._param((num_experts, *block_scale_shape(hidden_size, self.inter)),
                                               torch.float32)
        self.w13_bias = self._param((num_experts, 2 * self.inter), dtype) if bias else None
        self.w2_bias = self._param((num_experts, hidden_size), dtype) if bias else None
        # MXFP4 on a GPU with the fused kernel: the packed bytes go into its order (layers/mxfp4.py) once filled.
        # Decided here, not when filled: graphs captured while the checkpoint loads beside them bake the flag into
        # their kernels, and it must be the order the weights end in.
        self.kernel_layout = quant == "mxfp4" and self.w13_weight.is_cuda and moe_ops() is not None
        self.clear_padding()

    def _param(self, shape: tuple[int, ...], dtype: torch.dtype | None) -> nn.Parameter:
        param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        param.weight_loader = self.expert_loader
        return param

    # -- loading -------------------------------------------------------------------------------------------
    def expert_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: tuple[int, str]) -> None:
        """Copy one expert's checkpoint tensor into its slot: shard = (expert, "gate" | "up" | "down"). `loaded`
        is the whole expert's tensor (weight [out, in], bias [out] or block scales); this rank takes its slice of
        the intermediate width. An unquantized tensor loading into FP8 experts is quantized here, by blocks."""
        expert, which = shard
        if param.dtype == FP8 and loaded.dtype != FP8:
            q, scale = quantize_blocks(loaded.to(param.device, torch.float32))
            self.expert_loader(param, q, shard)
            scales = self.w13_weight_scale if param is self.w13_weight else self.w2_weight_scale
            self.expert_loader(scales, scale, shard)
            return
        dst = param.data[expert]
        name = f"expert {expert} {which}"
        if which == "down":
            if loaded.dim() == 2:  # weight or scales [H, I]: this rank's input columns
                start, real = self._slice(dst.shape[-1], loaded, 1, name)
                loaded, dst = loaded.narrow(1, start, real), dst.narrow(1, 0, real)
            elif self.ps.rank != 0:  # the bias: added once, by rank 0, to partial sums that are all-reduced
                loaded = torch.zeros_like(loaded)
            _copy(dst, loaded, name)
        else:  # gate rows first, then up rows (this rank's of each: weights, scales, bias)
            rows = dst.shape[0] // 2
            start, real = self._slice(rows, loaded, 0, name)
            dst = dst.narrow(0, 0 if which == "gate" else rows, real)
            _copy(dst, loaded.narrow(0, start, real), name)

    def _slice(self, extent: int, loaded: torch.Tensor | None = None, dim: int = 0, name: str = "") -> tuple[int, int]:
        """(start, length) in the checkpoint of this rank's real slice, for a tensor that holds `extent` entries along
        the rank's intermediate width: weights 1 an intermediate column, MXFP4 bytes 1 per 2, exponents 1 per 32,
        FP8 scales 1 per 128. With `loaded`, first checks that it holds the whole width along `dim`."""
        if loaded is not None and loaded.shape[dim] != -(-self.intermediate_size * extent // self.inter):
            raise ValueError(f"{name}: checkpoint shape {tuple(loaded.shape)} does not hold the expert's "
                             f"{self.intermediate_size}-wide intermediate along dim {dim}")
        return self.shard.start * extent // self.inter, self.shard.real * extent // self.inter

    def clear_padding(self) -> None:
        """Zero the columns past this rank's real slice (MXFP4 ranks padded to whole groups), which the checkpoint
        never writes, so they add nothing; called once built and again after random weights fill everything."""
        if self.shard.real == self.shard.held:
            return
        for param in (self.w13_weight, getattr(self, "w13_weight_scale", None), self.w13_bias):
            if param is not None:
                rows = param.shape[1] // 2
                real = self._slice(rows)[1]
                for half in (0, rows):
                    param.data[:, half + real:half + rows].zero_()
        for param in (self.w2_weight, self.w2_weight_scale):
            param.data[..., self._slice(param.shape[-1])[1]:].zero_()

    def weights_filled(self) -> None:
        """Called each time the weights have been written in checkpoint order (a load, random weights, a level-2
        wake-up's reload): MXFP4 experts on a GPU with the fused kernel go into its byte order, expert by expert (a
        transient copy of one expert's projection at a time)."""
        if not self.kernel_layout:
            return
        for param in (self.w13_weight, self.w2_weight):
            for expert in range(param.shape[0]):
                param.data[expert].copy_(to_kernel_layout(param.data[expert]))

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                reduce: bool = True) -> torch.Tensor:
        """x [T, H], topk_weights [T, k], topk_ids [T, k] -> [T, H]: the fused kernel on CUDA, else the reference."""
        ops = moe_ops() if x.is_cuda else None
        if ops is not None:  # FP8 and MXFP4 experts as they are stored, with their scales
            out = ops.fused_experts(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, self.activation,
                                    self.w13_bias, self.w2_bias, getattr(self, "w13_weight_scale", None),
                                    getattr(self, "w2_weight_scale", None), kernel_layout=self.kernel_layout)
        elif self.quant == "fp8":
            out = experts_reference_fp8(x, self.w13_weight, self.w13_weight_scale, self.w2_weight,
                                        self.w2_weight_scale, topk_weights, topk_ids, self.activation,
                                        self.w13_bias, self.w2_bias)
        elif self.quant == "mxfp4":
            out = experts_reference(x, _Mxfp4Experts(self.w13_weight, self.w13_weight_scale, x.dtype,
                                                     self.kernel_layout),
                                    _Mxfp4Experts(self.w2_weight, self.w2_weight_scale, x.dtype, self.kernel_layout),
                                    topk_weights, topk_ids, self.activation, self.w13_bias, self.w2_bias)
        else:
            out = experts_reference(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, self.activation,
                                    self.w13_bias, self.w2_bias)
        return self.ps.all_reduce(out) if reduce else out


class _Mxfp4Experts:
    """Stacked MXFP4 experts that widen one expert when indexed (experts_reference reads w[expert] only)."""

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                 kernel_layout: bool = False) -> None:
        self.blocks, self.scales, self.dtype, self.kernel_layout = blocks, scales, dtype, kernel_layout
        self.shape = (blocks.shape[0], blocks.shape[1], scales.shape[-1] * MXFP4_GROUP)

    def __getitem__(self, expert: int) -> torch.Tensor:
        blocks = from_kernel_layout(self.blocks[expert]) if self.kernel_layout else self.blocks[expert]
        return dequantize_mxfp4(blocks, self.scales[expert], self.dtype)


def quantize_experts(full: torch.Tensor, param: torch.Tensor, scale: torch.Tensor) -> None:
    """Quantize stacked experts [E, N, K] into an FP8 parameter and its block scales: w13's gate and up halves each
    on their own blocks where its scales say so (w2, or halves of whole blocks, come out the same either way)."""
    n, k = full.shape[1:]
    halves = 2 if n % 2 == 0 and scale.shape[1] == block_scale_shape(n, k, n // 2)[0] else 1
    rows = n // halves
    for e in range(full.shape[0]):
        for half in range(halves):
            q, s = quantize_blocks(full[e, half * rows:(half + 1) * rows])
            param.data[e, half * rows:(half + 1) * rows].copy_(q)
            scale.data[e, half * s.shape[0]:(half + 1) * s.shape[0]].copy_(s)


@functools.cache  # asked once per MoE layer of every step
def moe_ops():
    """The fused-MoE Triton module, None when triton does not import (the reference path runs)."""
    try:
        from railyard.engine.runner.kernels import fused_moe
    except ImportError:
        return None
    return fused_moe


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src)
