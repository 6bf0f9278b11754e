"""Reference paged attention in plain torch (CPU and CUDA): gathers each sequence's blocks.

Slow but obviously right; the oracle for the Triton kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from railyard.engine.attention.metadata import AttentionMetadata


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new keys/values at their slots; kv_cache is [2, num_blocks, block_size, kv_heads, head_dim]."""
    _, nb, bs, hk, d = kv_cache.shape
    kv_cache[0].view(nb * bs, hk, d)[slot_mapping] = k
    kv_cache[1].view(nb * bs, hk, d)[slot_mapping] = v


class TorchAttentionBackend:
    """Causal attention of each sequence's new queries over its whole cached context."""

    name = "torch"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        write_kv(kv_cache, k, v, meta.slot_mapping)
        if meta.decode_only:
            return self._decode(q, kv_cache, meta)
        out = torch.empty_like(q)
        starts = meta.query_start_loc_cpu
        for i, seq_len in enumerate(meta.seq_lens_cpu):
            s, e = starts[i], starts[i + 1]
            keys, values = self._gather(kv_cache, meta.block_tables[i], seq_len)
            q_pos = torch.arange(seq_len - (e - s), seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
            out[s:e] = self._attend(q[s:e], keys, values, mask)
        return out

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        b, max_len = meta.num_seqs, meta.max_seq_len
        _, nb, bs, hk, d = kv_cache.shape
        n_blocks = -(-max_len // bs)
        table = meta.block_tables[:, :n_blocks].long()
        keys = kv_cache[0][table].reshape(b, n_blocks * bs, hk, d)[:, :max_len]
        values = kv_cache[1][table].reshape(b, n_blocks * bs, hk, d)[:, :max_len]
        mask = torch.arange(max_len, device=q.device)[None, :] < meta.seq_lens[:, None]
        groups = self.num_heads // hk
        qh = q.view(b, self.num_heads, 1, d)
        kh = keys.permute(0, 2, 1, 3).repeat_interleave(groups, dim=1)
        vh = values.permute(0, 2, 1, 3).repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[:, None, None, :], scale=self.scale)
        return out.view(b, self.num_heads, d)

    def _gather(self, kv_cache: torch.Tensor, table: torch.Tensor, seq_len: int):
        bs = kv_cache.shape[2]
        blocks = table[: -(-seq_len // bs)].long()
        keys = kv_cache[0][blocks].flatten(0, 1)[:seq_len]
        values = kv_cache[1][blocks].flatten(0, 1)[:seq_len]
        return keys, values

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        groups = self.num_heads // keys.shape[1]
        qh = q.transpose(0, 1)  # [H, n, d]
        kh = keys.transpose(0, 1).repeat_interleave(groups, dim=0)
        vh = values.transpose(0, 1).repeat_interleave(groups, dim=0)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None], scale=self.scale)
        return out.transpose(0, 1)
