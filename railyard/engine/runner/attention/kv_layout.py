"""Where each key and value sits in a paged KV cache [2, num_blocks, block_size, kv_heads, head_dim].

Keys (plane 0) sit as the shape says. Values (plane 1) do too, except in an FP8 cache, whose blocks hold their
values as [kv_heads, head_dim, block_size]: tokens innermost. Why: the P.V product of the attention kernels takes
V with consecutive tokens in each thread's registers; from a token-major tile of bytes that is one shared-memory
load per byte (Hopper's ldmatrix transposes 16-bit elements, not 8-bit), which left decode over an FP8 cache at
half the bandwidth of a bf16 one (docs/lab-notes). With tokens innermost each block's values for one head
are one contiguous [head_dim, block_size] run, read in 16-byte copies (vLLM's first paged attention kept its V
cache [head_size, block_size] per block for the same reason). The cache tensor keeps its shape, so block copies
(swap, prefix caching) and sizes are the same for every dtype; only code that indexes inside a block reads it
through `value_blocks` (the torch backend, the tests) or computes the offsets itself (the Triton kernels).
"""

from __future__ import annotations

import torch

from railyard.engine.runner.layers.fp8 import FP8, cache_bits


def values_tokens_inner(kv_cache: torch.Tensor) -> bool:
    """Whether the cache's value blocks are [kv_heads, head_dim, block_size] (FP8) rather than token-major."""
    return kv_cache.dtype == FP8


def key_blocks(kv_cache: torch.Tensor) -> torch.Tensor:
    """The keys as [num_blocks, block_size, kv_heads, head_dim] (an FP8 cache as raw bytes): a view."""
    return cache_bits(kv_cache[0])


def value_blocks(kv_cache: torch.Tensor) -> torch.Tensor:
    """The values as [num_blocks, block_size, kv_heads, head_dim] (an FP8 cache as raw bytes): a view, strided
    where the blocks keep tokens innermost, so indexing it reads and writes the cache itself."""
    plane = cache_bits(kv_cache[1])
    if not values_tokens_inner(kv_cache):
        return plane
    nb, bs, hk, d = plane.shape
    return plane.view(nb, hk, d, bs).permute(0, 3, 1, 2)
