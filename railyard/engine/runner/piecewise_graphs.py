"""Piecewise CUDA graphs: every step that is not pure decode replays graphs of all but attention.

A step that carries a prefill chunk cannot replay one whole-model graph: the attention kernels' grids
follow each sequence's query length. Launched eagerly, the other ~25 kernels of each layer cost about as much
Python launch time on a 7B model as a mixed prefill + decode step's GPU work. So, as vLLM v1 does
(its piecewise backend, splitting the model at attention), the forward pass is split at each layer's
attention into num_layers + 1 pieces (models/decoder.py's first/middle/last_piece), each captured once
per padded token count; at run time the pieces replay and attention runs eagerly between them, on the
step's real tokens only.

Every piece reads and writes the same static buffers (ids, positions, q, k, v, attention output,
residual, hidden), sized for the largest bucket; the pieces' own temporaries come from one graph memory
pool shared by all pieces and buckets (captured largest first). Padded rows (id 0, position 0) write no
KV (attention never sees them) and, every piece being row-wise, never change the real rows.

`capture=False` runs the same pieces, buffers and padding eagerly: the CPU tests' proof that the split
and the buffer wiring reproduce the unsplit forward.
"""

from __future__ import annotations

import logging
import time

import torch

from railyard.engine.runner.attention.metadata import AttentionMetadata
from railyard.engine.runner.decode_graphs import padded_size, staging_free, upload
from railyard.engine.runner.graph_capture import capture_each, capture_graph

log = logging.getLogger("railyard.engine")


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Token-count buckets up to max_tokens (always one): 16, 32, then 1x and 1.5x each power of two below 256,
    where a step reads its weights in about the same time whatever its rows; from 256, where GEMMs are
    compute-bound and padding costs time, quarter steps (at most 25% padding)."""
    sizes, p = [16, 32], 64
    while p < max_tokens:
        sizes += [p, p * 3 // 2] if p < 256 else [p, p * 5 // 4, p * 3 // 2, p * 7 // 4]
        p *= 2
    return sorted({s for s in sizes if s < max_tokens} | {max_tokens})


class PiecewiseGraphs:
    """The model's forward pass as captured pieces per token-count bucket, attention run eagerly between them."""

    def __init__(self, model, max_tokens: int, device: torch.device, capture: bool = True,
                 beside_load: bool = False) -> None:
        self.model, self.device = model, device
        self.decoder = model.model
        self.layers = self.decoder.layers
        self.sizes = piecewise_sizes(max_tokens)
        self.max_tokens = mt = self.sizes[-1]
        attn = self.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        hidden = self.decoder.norm.weight.shape[0]
        dtype = model.lm_head.weight.dtype
        pin = device.type == "cuda"
        self.host_ints = torch.zeros(2 * mt, dtype=torch.long, pin_memory=pin)  # ids | positions
        self.host_ints_np = self.host_ints.numpy()
        self.ints = torch.zeros(2 * mt, dtype=torch.long, device=device)

        def buf(width: int) -> torch.Tensor:
            return torch.zeros((mt, width), dtype=dtype, device=device)

        self.q = buf(self.num_heads * self.head_dim)
        self.k, self.v = buf(self.num_kv_heads * self.head_dim), buf(self.num_kv_heads * self.head_dim)
        self.attn_out, self.residual, self.hidden = buf(self.num_heads * self.head_dim), buf(hidden), buf(hidden)
        self.static_bytes = sum(t.numel() * t.element_size()
                                for t in (self.ints, self.q, self.k, self.v, self.attn_out, self.residual, self.hidden))
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.copied = torch.cuda.Event() if pin else None  # the last host-to-device copy out of host_ints
        self.capture_seconds = 0.0
        self.warmed_up: list[int] = []  # the buckets run eagerly before their capture (graph_capture.capture_each)
        # Another thread may fill the weights meanwhile (model_runner): its copies and allocations are CUDA calls
        # that torch's default "global" capture mode forbids any thread while a graph is captured; "thread_local"
        # forbids them to the capturing thread only. (The pieces read the weights' addresses, never their values:
        # the one eager warm-up computes garbage, which nothing keeps; so a kernel that indexes memory by a computed
        # value, as the MoE router's expert ids, must stay in range whatever the weights hold.)
        self.capture_error_mode = "thread_local" if beside_load else "global"
        if capture:
            self._capture()

    # -- the pieces -------------------------------------------------------------------------------
    def _piece(self, i: int, n: int) -> None:
        """Piece i over the first n rows of the static buffers (what a graph of bucket n holds)."""
        pos = self.ints[self.max_tokens:self.max_tokens + n]
        if i == len(self.layers):
            self.hidden[:n].copy_(self.decoder.last_piece(self.attn_out[:n], self.residual[:n]))
            return
        if i == 0:
            q, k, v, residual = self.decoder.first_piece(self.ints[:n], pos)
        else:
            q, k, v, residual = self.decoder.middle_piece(i, pos, self.attn_out[:n], self.residual[:n])
        self.q[:n].copy_(q.reshape(n, -1))
        self.k[:n].copy_(k.reshape(n, -1))
        self.v[:n].copy_(v.reshape(n, -1))
        self.residual[:n].copy_(residual)

    def _attention_views(self, n: int) -> tuple[torch.Tensor, ...]:
        """q, k, v and the attention output of the step's n real tokens, as attention takes them: made once a step,
        since every layer's attention reads the same static buffers (host work between launches is step time)."""
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        return (self.q[:n].view(n, h, d), self.k[:n].view(n, hk, d), self.v[:n].view(n, hk, d),
                self.attn_out[:n].view(n, h, d))

    @torch.inference_mode()
    def _capture(self) -> None:
        start = time.perf_counter()
        pool = None
        pieces = len(self.layers) + 1

        def warm_up(n: int) -> None:  # compile kernels, create library handles and workspaces outside capture
            for i in range(pieces):
                self._piece(i, n)
            torch.cuda.synchronize(self.device)

        def capture(n: int) -> None:  # the bucket's graphs are kept only once every piece is captured
            nonlocal pool
            graphs = []
            for i in range(pieces):
                graph = torch.cuda.CUDAGraph()
                with capture_graph(graph, pool, self.capture_error_mode):
                    self._piece(i, n)
                pool = graph.pool()
                graphs.append(graph)
            self.graphs[n] = graphs

        # largest first: smaller buckets reuse its pool (emptied once by the model runner, before the first)
        self.warmed_up = warmed = capture_each(list(reversed(self.sizes)), warm_up, capture)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        log.info("captured piecewise CUDA graphs (%d pieces x %d token counts, 16..%d; warmed up first: %s) in %.1f s",
                 pieces, len(self.sizes), self.max_tokens, warmed, self.capture_seconds)

    # -- one step ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, input_ids: list[int], positions: list[int], kv_caches: list[torch.Tensor], meta: AttentionMetadata,
            feed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Final hidden states [n, hidden] of one step of n <= max_tokens tokens (a view of a static buffer,
        valid until the next run).

        feed: (rows, ids) on the device, ids that overwrite input_ids[rows] (asynchronous scheduling)."""
        n = len(input_ids)
        bucket = padded_size(self.sizes, n)
        mt = self.max_tokens
        staging_free(self.copied)
        h = self.host_ints_np
        h[0:n] = input_ids
        h[mt:mt + n] = positions
        h[n:bucket] = 0
        h[mt + n:mt + bucket] = 0
        upload(self.copied, (self.ints, self.host_ints))
        if feed is not None:
            self.ints[feed[0]] = feed[1]
        q, k, v, out = self._attention_views(n)
        for i, cache in enumerate(kv_caches):  # layer i's attention over the real tokens, into the static output
            self._replay(i, bucket)
            self.layers[i].self_attn.attn.forward(q, k, v, cache, meta, out=out)
        self._replay(len(self.layers), bucket)
        return self.hidden[:n]

    def _replay(self, i: int, bucket: int) -> None:
        if self.graphs:
            self.graphs[bucket][i].replay()
        else:
            self._piece(i, bucket)
