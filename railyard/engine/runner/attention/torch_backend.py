"""Reference paged attention in plain torch (CPU and CUDA): gathers each sequence's blocks.

Slow but obviously right; the oracle for the Triton kernels. The cache may be narrower than the model
(bf16 or FP8 under a float32 model, FP8 under bf16): new keys/values are stored as `quantize_kv` makes
them and read back exactly (e4m3 and bf16 widen to the query dtype without rounding). An FP8 cache's
per-layer scales are applied where the Triton kernels apply them: k_scale folded into the softmax
scale, v_scale on the output.

A sliding window masks keys more than `sliding_window - 1` positions before each query (HF's mask); learned
sinks (gpt-oss) add one logit per head to each softmax denominator, as HF's eager attention does.
Block-table entries before a window may be freed (-1): they are read as block 0 and masked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from railyard.engine.runner.attention.kv_layout import key_blocks, value_blocks
from railyard.engine.runner.attention.base import AttentionBackend
from railyard.engine.runner.attention.metadata import AttentionMetadata
from railyard.engine.runner.layers.fp8 import FP8, cache_bits, quantize_kv


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Store new keys/values at their slots; kv_cache is [2, num_blocks, block_size, kv_heads, head_dim]
    (attention.kv_layout: an FP8 cache's value blocks keep tokens innermost)."""
    bs = kv_cache.shape[2]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    key_blocks(kv_cache)[blocks, offsets] = cache_bits(quantize_kv(k, k_scale, kv_cache.dtype))
    value_blocks(kv_cache)[blocks, offsets] = cache_bits(quantize_kv(v, v_scale, kv_cache.dtype))


def _read(blocks: torch.Tensor, index: torch.Tensor, cache_dtype: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """blocks[index] (whole blocks of key_blocks / value_blocks) widened to the query dtype."""
    return blocks[index].contiguous().view(cache_dtype).to(dtype)


class TorchAttentionBackend(AttentionBackend):
    """Causal attention of each sequence's new queries over its whole cached context."""

    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """out: where to write the result [T, H, D] (as the Triton backend takes it), else a new tensor."""
        meta = self.layer_metadata(meta)
        result = self._forward(q, k, v, kv_cache, meta)
        if out is None:
            return result
        out.copy_(result)
        return out

    def _forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        fp8 = kv_cache.dtype == FP8
        write_kv(kv_cache, k, v, meta.slot_mapping, self.k_scale, self.v_scale)
        scale = self.scale * self.k_scale if fp8 else self.scale
        if meta.decode_only:
            out = self._decode(q, kv_cache, meta, scale)
        else:
            out = torch.empty_like(q)
            starts = meta.query_start_loc_cpu
            for i, seq_len in enumerate(meta.seq_lens_cpu):
                s, e = starts[i], starts[i + 1]
                keys, values = self._gather(kv_cache, meta.block_tables[i], seq_len, q.dtype)
                q_pos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
                k_pos = torch.arange(seq_len, device=q.device)[None, :]
                mask = k_pos <= q_pos[:, None]
                if self.window:
                    mask &= k_pos > q_pos[:, None] - self.window
                out[s:e] = self._attend(q[s:e], keys, values, mask, scale)
        return out * self.v_scale if fp8 and self.v_scale != 1.0 else out

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        b, max_len = meta.num_seqs, meta.max_seq_len
        _, nb, bs, hk, d = kv_cache.shape
        n_blocks = -(-max_len // bs)
        table = meta.block_tables[:, :n_blocks].long().clamp(min=0)
        keys = _read(key_blocks(kv_cache), table, kv_cache.dtype, q.dtype).reshape(b, n_blocks * bs, hk, d)
        values = _read(value_blocks(kv_cache), table, kv_cache.dtype, q.dtype).reshape(b, n_blocks * bs, hk, d)
        keys, values = keys[:, :max_len], values[:, :max_len]
        k_pos = torch.arange(max_len, device=q.device)[None, :]
        mask = k_pos < meta.seq_lens[:, None]
        if self.window:
            mask &= k_pos >= meta.seq_lens[:, None] - self.window
        groups = self.num_heads // hk
        qh = q.view(b, self.num_heads, 1, d)
        kh = keys.permute(0, 2, 1, 3).repeat_interleave(groups, dim=1)
        vh = values.permute(0, 2, 1, 3).repeat_interleave(groups, dim=1)
        out = self._softmax_v(qh, kh, vh, mask[:, None, None, :], scale)
        return out.view(b, self.num_heads, d)

    def _gather(self, kv_cache: torch.Tensor, table: torch.Tensor, seq_len: int, dtype: torch.dtype):
        bs = kv_cache.shape[2]
        blocks = table[: -(-seq_len // bs)].long().clamp(min=0)
        keys = _read(key_blocks(kv_cache), blocks, kv_cache.dtype, dtype).flatten(0, 1)[:seq_len]
        values = _read(value_blocks(kv_cache), blocks, kv_cache.dtype, dtype).flatten(0, 1)[:seq_len]
        return keys, values

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                scale: float) -> torch.Tensor:
        groups = self.num_heads // keys.shape[1]
        qh = q.transpose(0, 1)  # [H, n, d]
        kh = keys.transpose(0, 1).repeat_interleave(groups, dim=0)
        vh = values.transpose(0, 1).repeat_interleave(groups, dim=0)
        out = self._softmax_v(qh, kh, vh, mask[None], scale)
        return out.transpose(0, 1)

    def _softmax_v(self, qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, mask: torch.Tensor,
                   scale: float) -> torch.Tensor:
        """softmax(q k^T * scale, masked) v over [..., heads, queries, keys]; with sinks, HF's eager attention:
        each head's sink logit joins the scores before the softmax, and its weight is dropped after."""
        if self.sinks is None:
            return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        scores = (qh @ kh.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        sinks = self.sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
        return probs.to(vh.dtype) @ vh
