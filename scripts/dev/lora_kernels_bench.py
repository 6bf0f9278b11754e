"""The batched LoRA kernels against the base GEMMs they ride on, qwen2-7b's four LoRA points (qkv, o, gate_up, down),
rank 16, on the GPU: device microseconds per call inside a CUDA graph (what a captured decode step pays, launch gaps
included), for a decode and a prefill token count, one adapter and eight (tokens spread evenly); then a sweep of the
shrink's and the expand's tiles at each point. JSON lines on stdout, all of it in $OUT/lora_kernels.json.

    TOKENS=256,16384 SLOTS=1,8 python3 scripts/dev/lora_kernels_bench.py
"""
from __future__ import annotations

import itertools
import json
import os
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from railyard.engine.runner.kernels import lora  # noqa: E402
from railyard.engine.runner.layers.lora import LoRABatch, LoRAWeights  # noqa: E402

H, I, HEAD, HEADS, KV_HEADS, RANK = 3584, 18944, 128, 28, 4, 16
POINTS = {"qkv": (H, [HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD]), "o": (H, [H]), "gate_up": (H, [I, I]),
          "down": (I, [H])}
dev = torch.device("cuda")
REPS = 20


def graphed_us(fn) -> float:
    """Device microseconds per call of fn, replayed REPS times in one CUDA graph."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1000 / REPS)
    return best


rows = []


def emit(row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


tokens = [int(t) for t in os.environ.get("TOKENS", "256,16384").split(",")]
slot_counts = [int(s) for s in os.environ.get("SLOTS", "1,8").split(",")]
SWEEP_MAX_TOKENS = int(os.environ.get("SWEEP_MAX_TOKENS", "1024"))  # the tile sweeps run at decode token counts
torch.manual_seed(0)
for t, slots in itertools.product(tokens, slot_counts):
    batch = LoRABatch(slots, t, dev)
    batch.stage(np.arange(t, dtype=np.int32) % slots)
    batch.prepare(t)
    emit({"tokens": t, "slots": slots, "op": "prepare", "us": round(graphed_us(lambda: batch.prepare(t)), 1)})
    for name, (k, parts) in POINTS.items():
        n_out = sum(parts)
        x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n_out, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
        y = torch.empty(t, n_out, device=dev, dtype=torch.bfloat16)
        lw = LoRAWeights(batch, RANK, k, parts, torch.bfloat16, dev)
        lw.a.normal_(0, k ** -0.5)
        lw.b.normal_(0, 0.01)
        shrunk = lora.shrink(x, lw.a, batch.order, batch.counts, batch.starts)
        base = graphed_us(lambda: torch.matmul(x, w.T, out=y))
        zeros = graphed_us(lambda: torch.zeros((t, shrunk.shape[1]), dtype=torch.float32, device=dev))
        shrink = graphed_us(lambda: lora.shrink(x, lw.a, batch.order, batch.counts, batch.starts))
        expand = graphed_us(lambda: lora.expand(shrunk, lw.b, y, batch.order, batch.counts, batch.starts,
                                                lw.part_offsets, max(parts), RANK))
        emit({"tokens": t, "slots": slots, "op": name, "base_us": round(base, 1), "zeros_us": round(zeros, 1),
              "shrink_us": round(shrink, 1), "expand_us": round(expand, 1),
              "lora_over_base": round((shrink + expand) / base, 3)})

        if t > SWEEP_MAX_TOKENS:
            continue
        # the shrink's tiles (split over K with atomics where SPLIT_K > 1)
        n = shrunk.shape[1]
        sweep = []
        for bm, bn, bk, sk, warps in itertools.product((16, 32, 64), (16, 32), (64, 128), (1, 2, 4, 8, 16), (4,)):
            if bn > max(16, n):
                continue
            out = torch.zeros((t, n), dtype=torch.float32, device=dev)
            grid = (triton.cdiv(t, bm) + slots, triton.cdiv(n, bn) * sk)

            def run(bm=bm, bn=bn, bk=bk, sk=sk, warps=warps, out=out, grid=grid):
                if sk > 1:
                    out.zero_()
                lora._shrink_kernel[grid](x, lw.a, out, batch.order, batch.counts, batch.starts, n, k, x.stride(0),
                                          x.stride(1), lw.a.stride(0), lw.a.stride(1), lw.a.stride(2), out.stride(0),
                                          out.stride(1), NUM_SLOTS=slots, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                          SPLIT_K=sk, DOT_PRECISION="tf32", num_warps=warps)
            try:
                sweep.append((graphed_us(run), dict(bm=bm, bn=bn, bk=bk, sk=sk, warps=warps)))
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is skipped, not fatal
                sweep.append((float("inf"), dict(bm=bm, bn=bn, bk=bk, sk=sk, warps=warps, error=type(e).__name__)))
        sweep.sort(key=lambda s: s[0])
        emit({"tokens": t, "slots": slots, "op": f"{name}.shrink_sweep",
              "best": [dict(us=round(u, 1), **c) for u, c in sweep[:5]]})

        sweep = []
        for bm, bn, warps in itertools.product((16, 32, 64), (64, 128, 256), (4, 8)):
            tiles = triton.cdiv(max(parts), bn)
            grid = (triton.cdiv(t, bm) + slots, tiles * len(parts))

            def run(bm=bm, bn=bn, warps=warps, tiles=tiles, grid=grid):
                lora._expand_kernel[grid](shrunk, lw.b, y, batch.order, batch.counts, batch.starts, lw.part_offsets,
                                          shrunk.stride(0), shrunk.stride(1), lw.b.stride(0), lw.b.stride(1),
                                          lw.b.stride(2), y.stride(0), y.stride(1), NUM_SLOTS=slots,
                                          TILES_PER_PART=tiles, RANK=RANK, BLOCK_M=bm, BLOCK_N=bn,
                                          DOT_PRECISION="tf32", num_warps=warps)
            try:
                sweep.append((graphed_us(run), dict(bm=bm, bn=bn, warps=warps)))
            except Exception as e:  # noqa: BLE001
                sweep.append((float("inf"), dict(bm=bm, bn=bn, warps=warps, error=type(e).__name__)))
        sweep.sort(key=lambda s: s[0])
        emit({"tokens": t, "slots": slots, "op": f"{name}.expand_sweep",
              "best": [dict(us=round(u, 1), **c) for u, c in sweep[:5]]})

json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "lora_kernels.json"), "w"), indent=1)
