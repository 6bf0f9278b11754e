"""CUDA graphs for decode steps: forward + LM head captured once per padded batch size, replayed each step.

A decode step of a 7B model is ~30 kernels per layer; launched one by one from Python the launches
cost as much as the GPU work. A captured graph replays them in one call. Inputs live in static
buffers: one pinned host staging area and one host-to-device copy per step for ids, positions,
slots and lengths, one more for the block tables. Padded rows write no KV (slot -1) and attend to
nothing (length 0). Where sliding-window layers keep blocks of their own, their slots and block tables ride
in the same copies.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from railyard.engine.runner.attention.metadata import AttentionMetadata
from railyard.engine.runner.graph_capture import capture_each, capture_graph

log = logging.getLogger("railyard.engine")


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch] + list(range(16, max_batch + 1, 16))
    if max_batch not in sizes:
        sizes.append(max_batch)
    return sorted(sizes)


class DecodeGraphs:
    """Captured decode steps for a ladder of batch sizes; `run` pads a step to the next captured size."""

    def __init__(self, model, kv_caches: list[torch.Tensor], max_batch: int, max_model_len: int,
                 block_size: int, device: torch.device, sliding: bool = False) -> None:
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes = graph_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        mb = self.max_batch
        self.sliding = sliding
        rows = 2 if sliding else 1  # block tables: the full layers' (and the sliding layers' below them)
        # ids | positions | slots | seq_lens (| sliding slots), as one int64 staging area (one copy per step)
        self.host_ints = torch.zeros((5 if sliding else 4) * mb, dtype=torch.long, pin_memory=True)
        self.host_ints_np = self.host_ints.numpy()
        self.host_tables = torch.zeros((rows * mb, self.max_blocks), dtype=torch.int32, pin_memory=True)
        self.host_tables_np = self.host_tables.numpy()
        self.ints = torch.zeros(self.host_ints.shape[0], dtype=torch.long, device=device)
        self.ints[2 * mb:3 * mb] = -1
        self.ints[4 * mb:] = -1
        self.block_tables = torch.zeros((rows * mb, self.max_blocks), dtype=torch.int32, device=device)
        self.query_start = torch.arange(mb + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.warmed_up: list[int] = []  # the sizes run eagerly before their capture (graph_capture.capture_each)
        self.logits: dict[int, torch.Tensor] = {}
        self.copied = torch.cuda.Event()  # the last host-to-device copy out of the staging buffers
        self._capture()

    def _views(self, bs: int):
        mb = self.max_batch
        ids = self.ints[0:bs]
        pos = self.ints[mb:mb + bs]
        meta = AttentionMetadata(
            slot_mapping=self.ints[2 * mb:2 * mb + bs], query_start_loc=self.query_start[:bs + 1],
            seq_lens=self.ints[3 * mb:3 * mb + bs], block_tables=self.block_tables[:bs],
            max_query_len=1, max_seq_len=self.max_model_len,  # fixes the decode kernel's context splits
            query_start_loc_cpu=list(range(bs + 1)), seq_lens_cpu=[self.max_model_len] * bs)
        if self.sliding:
            meta.sliding = dataclasses.replace(meta, slot_mapping=self.ints[4 * mb:4 * mb + bs],
                                               block_tables=self.block_tables[mb:mb + bs])
        return ids, pos, meta

    @torch.inference_mode()
    def _capture(self) -> None:
        start = time.perf_counter()
        pool = None

        def warm_up(bs: int) -> None:
            # One eager run compiles (or loads) the kernels and creates library handles and workspaces outside
            # capture: before the first size, and before any size whose capture would meet a kernel not loaded yet.
            ids, pos, meta = self._views(bs)
            self.model.compute_logits(self.model(ids, pos, self.kv_caches, meta))
            torch.cuda.synchronize(self.device)

        def capture(bs: int) -> None:
            nonlocal pool
            ids, pos, meta = self._views(bs)
            graph = torch.cuda.CUDAGraph()
            with capture_graph(graph, pool):
                logits = self.model.compute_logits(self.model(ids, pos, self.kv_caches, meta))
            pool = graph.pool()
            self.graphs[bs], self.logits[bs] = graph, logits

        # largest first: smaller graphs reuse its memory pool (emptied once by the model runner, before the first)
        self.warmed_up = warmed = capture_each(list(reversed(self.sizes)), warm_up, capture)
        torch.cuda.synchronize(self.device)
        log.info("captured decode CUDA graphs for %d batch sizes (1..%d; warmed up first: %s) in %.1f s",
                 len(self.sizes), self.max_batch, warmed, time.perf_counter() - start)

    def padded_size(self, n: int) -> int | None:
        return padded_size(self.sizes, n)

    def run(self, input_ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int],
            block_tables: list[list[int]], feed: tuple[torch.Tensor, torch.Tensor] | None = None,
            sliding_slots: list[int] | None = None, sliding_tables: list[list[int]] | None = None) -> torch.Tensor:
        """Logits [n, vocab] of one decode step of n <= max_batch sequences (one new token each).

        feed: (rows, ids) on the device, ids that overwrite input_ids[rows] (tokens the previous step
        sampled, still on the device under asynchronous scheduling). sliding_slots / sliding_tables: the
        sliding-window layers' (when they keep blocks of their own)."""
        n = len(input_ids)
        bs = self.padded_size(n)
        mb = self.max_batch
        staging_free(self.copied)
        h = self.host_ints_np
        h[0:n] = input_ids
        h[mb:mb + n] = positions
        h[2 * mb:2 * mb + n] = slots
        h[3 * mb:3 * mb + n] = seq_lens
        if bs > n:
            h[n:bs] = 0
            h[mb + n:mb + bs] = 0
            h[2 * mb + n:2 * mb + bs] = -1
            h[3 * mb + n:3 * mb + bs] = 0
        width = max(len(t) for t in block_tables)
        tables = self.host_tables_np
        for i, t in enumerate(block_tables):
            tables[i, :len(t)] = t
        copies = [(self.ints, self.host_ints), (self.block_tables[:n, :width], self.host_tables[:n, :width])]
        if self.sliding:
            h[4 * mb:4 * mb + n] = sliding_slots
            h[4 * mb + n:4 * mb + bs] = -1
            for i, t in enumerate(sliding_tables):
                tables[mb + i, :len(t)] = t
            copies.append((self.block_tables[mb:mb + n, :width], self.host_tables[mb:mb + n, :width]))
        upload(self.copied, *copies)
        if feed is not None:
            self.ints[feed[0]] = feed[1]
        self.graphs[bs].replay()
        return self.logits[bs][:n]


def padded_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size that holds n rows (None: none does)."""
    return next((s for s in sizes if s >= n), None)


def staging_free(copied: torch.cuda.Event | None) -> None:
    """Wait until the last copy out of a host staging buffer has run, before the host rewrites the buffer.

    The host runs ahead of the GPU (asynchronous scheduling keeps a step queued behind the running one), so
    that copy may not have run yet: writing first would hand the GPU the next step's ids, positions or slots,
    or a half-written mix (seen on the H200 as a device-side assert in an index op). None: on the CPU."""
    if copied is not None:
        copied.synchronize()


def upload(copied: torch.cuda.Event | None, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Copy host staging buffers to their device buffers (dst, src) without blocking the host, recording
    `copied` after them (callers wait on it with `staging_free` before their next write to the sources)."""
    for dst, src in pairs:
        dst.copy_(src, non_blocking=True)
    if copied is not None:
        copied.record()


def padded_block_tables(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one int32 array, rows padded with block 0 (never read past a sequence's length)."""
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, :len(t)] = t
    return out
