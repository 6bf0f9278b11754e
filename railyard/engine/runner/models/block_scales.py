"""Block-scaled FP8 checkpoints (Qwen3-30B-A3B-FP8's layout): every linear weight e4m3 with one float32 scale per
128 x 128 block (`weight_scale_inv`, or compressed-tensors' `weight_scale`). Experts load them as they are (their
kernel takes block scales); every other weight is dequantized here, as soon as the weight and its scale have both
been read, and its layer quantizes it again per output channel as it loads (layers/linear.py), so attention and
dense MLPs keep their per-channel GEMMs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from railyard.engine.runner.layers.fp8 import FP8
from railyard.engine.runner.layers.fp8_block import dequantize_blocks
from railyard.engine.runner.models.moe_mlp import expert_target
from railyard.errors import ModelLoadError

_SCALES = ("weight_scale_inv", "weight_scale")


def per_channel_except_experts(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (name, tensor) pairs with each non-expert block-scaled FP8 weight replaced by its float32
    value (and its scale dropped); experts' tensors and unquantized ones pass unchanged."""
    weights_waiting: dict[str, torch.Tensor] = {}  # stem -> e4m3 weight whose scale has not been read yet
    scales_waiting: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if expert_target(name) is not None:
            yield name, tensor
            continue
        stem, _, kind = name.rpartition(".")
        if kind == "weight" and tensor.dtype == FP8:
            if stem in scales_waiting:
                yield name, dequantize_blocks(tensor, scales_waiting.pop(stem).float(), torch.float32)
            else:
                weights_waiting[stem] = tensor
        elif kind in _SCALES:
            if stem in weights_waiting:
                yield stem + ".weight", dequantize_blocks(weights_waiting.pop(stem), tensor.float(), torch.float32)
            else:
                scales_waiting[stem] = tensor
        else:
            yield name, tensor
    unpaired = sorted(weights_waiting) + sorted(scales_waiting)
    if unpaired:
        raise ModelLoadError(f"block-scaled FP8 checkpoint: {', '.join(unpaired[:5])} lack their weight or scale")
