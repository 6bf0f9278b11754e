"""`AttentionBackend`: what every paged-attention backend holds for its layer, whatever computes it."""

from __future__ import annotations

import torch

from railyard.engine.runner.attention.metadata import AttentionMetadata


class AttentionBackend:
    """One layer's attention over the paged KV cache: its head layout, an FP8 cache's scales, its sliding window
    and learned sinks. Subclasses compute `forward(q, k, v, kv_cache, meta, out=None)`."""

    name = "base"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.k_scale = self.v_scale = 1.0  # an FP8 cache's per-layer scales (a checkpoint may set them)
        self.window = sliding_window or 0  # a query sees this many tokens up to itself (0: all)
        self.sinks: torch.Tensor | None = None  # [num_heads] learned logits in each softmax denominator (gpt-oss)

    def layer_metadata(self, meta: AttentionMetadata) -> AttentionMetadata:
        """The step's metadata as this layer reads it: a sliding-window layer has slots and tables of its own."""
        return meta.sliding if self.window and meta.sliding is not None else meta
