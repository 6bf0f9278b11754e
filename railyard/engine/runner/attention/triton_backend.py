"""Triton paged attention (GPU): same interface and results as the torch reference backend.

Decode-only steps use the split-context decode kernel (graph-capturable: it reads lengths and
block tables from device tensors only); sequences with longer queries (prefill chunks, prefix-cache
hits) use the varlen prefill kernel over the paged cache. A mixed step runs its leading decodes through
the decode kernel and only the rest through the prefill kernel: in the prefill kernel a decode row is a
64-row query tile with one live row that walks its whole context in one program, without context splits, so
long-context decodes beside a prompt cost several times what the decode kernel takes for them (measured with
scripts/dev/mixed_step_cost.py; docs/lab-notes). vLLM splits its batches into decodes and prefills too.
"""

from __future__ import annotations

import functools

import torch

from railyard.engine.runner.attention.base import AttentionBackend
from railyard.engine.runner.attention.metadata import AttentionMetadata
from railyard.engine.runner.kernels.paged_attention import decode_splits, paged_decode, paged_prefill, store_kv


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    if not torch.cuda.is_available():
        return 1  # Triton's CPU interpreter (kernel tests without a GPU)
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Off: a mixed step's decodes go through the prefill kernel with its prompts (the A/B of mixed_step_cost.py).
SPLIT_MIXED_STEPS = True


class TritonAttentionBackend(AttentionBackend):
    """Causal attention of each sequence's new queries over its whole cached context, in Triton kernels."""

    name = "triton"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """out: where to write the result [T, H, D] (a static buffer of piecewise CUDA graphs), else a new tensor."""
        meta = self.layer_metadata(meta)
        scales = dict(k_scale=self.k_scale, v_scale=self.v_scale)
        store_kv(kv_cache, k, v, meta.slot_mapping, **scales)
        scales.update(window=self.window, sinks=self.sinks)
        if meta.decode_only:
            splits = decode_splits(q.shape[0], self.num_kv_heads, self._seen(meta.max_seq_len),
                                   _num_sms(q.device.index or 0))
            return paged_decode(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale, splits, out, **scales)
        if SPLIT_MIXED_STEPS and (nd := meta.num_decodes):
            # The leading decodes apart; the prefill kernel's grid covers the sequences after them only.
            (decode_tables, decode_lens), (tables, lens, starts) = meta.split
            out = torch.empty_like(q) if out is None else out
            splits = decode_splits(nd, self.num_kv_heads, self._seen(meta.decode_max_seq_len),
                                   _num_sms(q.device.index or 0))
            paged_decode(q[:nd], kv_cache, decode_tables, decode_lens, self.scale, splits, out[:nd], **scales)
            # starts are offsets into the whole batch: the prefill kernel reads and writes q and out there.
            return paged_prefill(q, kv_cache, tables, lens, starts, meta.max_query_len, self.scale, out, **scales)
        return paged_prefill(q, kv_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                             meta.max_query_len, self.scale, out, **scales)

    def _seen(self, context_len: int) -> int:
        """How many tokens a decode query reads from a context this long (what sizes its context splits)."""
        return min(context_len, self.window) if self.window else context_len
