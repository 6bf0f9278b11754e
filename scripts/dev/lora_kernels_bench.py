"""The batched LoRA kernels against the base GEMMs they ride on, qwen2-7b's four LoRA points (qkv, o, gate_up, down),
rank 16, on the GPU: device microseconds per call inside a CUDA graph (what a captured step pays, launch gaps
included), for a decode and a prefill token count, one adapter and eight (tokens spread evenly), the current kernels
(gate_up also as the expand fused with SiLU-and-mul, beside the activation alone) and, with BASELINE set, a previous
kernels/lora.py in the same process; then a sweep of the shrink's and the expand's
tiles at each point (decode token counts, eight adapters). JSON lines on stdout, all of it in $OUT/lora_kernels.json.

    mkdir -p .baseline/lora_old && git show 160b893:railyard/engine/runner/kernels/lora.py \
        > .baseline/lora_old/lora_old.py                     # carry .baseline/lora_old
    BASELINE=.baseline/lora_old TOKENS=256,16384 SLOTS=1,8 python3 scripts/dev/lora_kernels_bench.py
"""
from __future__ import annotations

import importlib
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
old = None
if os.environ.get("BASELINE"):
    sys.path.insert(0, os.environ["BASELINE"])
    old = importlib.import_module("lora_old")


def graphed_us(fn) -> float:
    """Device microseconds per call of fn, replayed REPS times in one CUDA graph (best of three replays)."""
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


def attempt(fn) -> float:
    try:
        return graphed_us(fn)
    except Exception:  # noqa: BLE001 - a tile that does not fit is reported as such, not fatal
        return float("inf")


tokens = [int(t) for t in os.environ.get("TOKENS", "256,16384").split(",")]
slot_counts = [int(s) for s in os.environ.get("SLOTS", "1,8").split(",")]
SWEEP_MAX_TOKENS = int(os.environ.get("SWEEP_MAX_TOKENS", "1024"))
SWEEP_SLOTS = int(os.environ.get("SWEEP_SLOTS", "8"))  # the tile sweeps run at this adapter count only
torch.manual_seed(0)
for t, slots in itertools.product(tokens, slot_counts):
    batch = LoRABatch(slots, t, dev)
    weights = {name: LoRAWeights(batch, RANK, k, parts, torch.bfloat16, dev) for name, (k, parts) in POINTS.items()}
    batch.allocate()
    batch.stage(np.arange(t, dtype=np.int32) % slots)
    batch.prepare(t)
    emit({"tokens": t, "slots": slots, "op": "prepare", "us": round(graphed_us(lambda: batch.prepare(t)), 1)})
    for name, (k, parts) in POINTS.items():
        n_out = sum(parts)
        x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n_out, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
        y = torch.empty(t, n_out, device=dev, dtype=torch.bfloat16)
        lw = weights[name]
        lw.a.normal_(0, k ** -0.5)
        lw.b.normal_(0, 0.01)
        out = batch.shrink_out(lw.workspace_first, lw.a.shape[1], t)
        shrunk = lora.shrink(x, lw.a, batch.order, batch.counts, batch.starts, out)
        row = {"tokens": t, "slots": slots, "op": name,
               "base_us": round(graphed_us(lambda: torch.matmul(x, w.T, out=y)), 1),
               "shrink_us": round(graphed_us(lambda: lora.shrink(x, lw.a, batch.order, batch.counts, batch.starts,
                                                                 out)), 1),
               "expand_us": round(graphed_us(lambda: lora.expand(
                   shrunk, lw.b, y, batch.order, batch.counts, batch.starts, lw.part_offsets, max(parts), RANK,
                   lw.parts_aligned)), 1)}
        if name == "gate_up":  # the gate/up expand fused with SiLU-and-mul, against the activation alone
            from railyard.engine.runner.kernels import fused
            row["silu_and_mul_us"] = round(graphed_us(lambda: fused.silu_and_mul(y)), 1)
            row["expand_silu_and_mul_us"] = round(graphed_us(lambda: lora.expand_silu_and_mul(
                shrunk, lw.b, y, batch.order, batch.counts, batch.starts, RANK)), 1)
        if old is not None:  # the previous kernels: a zeroed buffer of their own per call
            old_shrunk = old.shrink(x, lw.a, batch.order, batch.counts, batch.starts)
            row["old_shrink_us"] = round(graphed_us(lambda: old.shrink(x, lw.a, batch.order, batch.counts,
                                                                       batch.starts)), 1)
            row["old_expand_us"] = round(graphed_us(lambda: old.expand(
                old_shrunk, lw.b, y, batch.order, batch.counts, batch.starts, lw.part_offsets, max(parts), RANK)), 1)
            want, got = y.clone(), y.clone()
            old.expand(old_shrunk, lw.b, want, batch.order, batch.counts, batch.starts, lw.part_offsets, max(parts),
                       RANK)
            lora.expand(lora.shrink(x, lw.a, batch.order, batch.counts, batch.starts), lw.b, got, batch.order,
                        batch.counts, batch.starts, lw.part_offsets, max(parts), RANK, lw.parts_aligned)
            row["max_abs_diff_vs_old"] = (got.float() - want.float()).abs().max().item()
        emit(row)
        if t > SWEEP_MAX_TOKENS or slots != SWEEP_SLOTS:
            continue

        n = shrunk.shape[1]
        sweep = []
        for bm, bn, bk, sk in itertools.product((16, 32, 64), (16, 32), (64, 128), (1, 4, 8, 16)):
            if bn > max(16, n):
                continue
            buf = torch.zeros((t, n), dtype=torch.float32, device=dev)
            grid = (triton.cdiv(t, bm) + slots, triton.cdiv(n, bn) * sk)

            def run(bm=bm, bn=bn, bk=bk, sk=sk, buf=buf, grid=grid):
                if sk > 1:
                    buf.zero_()
                lora._shrink_kernel[grid](x, lw.a, buf, batch.order, batch.counts, batch.starts, n, k, x.stride(0),
                                          x.stride(1), lw.a.stride(0), lw.a.stride(1), lw.a.stride(2), buf.stride(0),
                                          buf.stride(1), NUM_SLOTS=slots, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                          SPLIT_K=sk, DOT_PRECISION="tf32")
            sweep.append((attempt(run), dict(bm=bm, bn=bn, bk=bk, sk=sk)))
        sweep.sort(key=lambda s: s[0])
        emit({"tokens": t, "slots": slots, "op": f"{name}.shrink_sweep",
              "best": [dict(us=round(u, 1), **c) for u, c in sweep[:5]]})

        sweep = []
        for bm, bn, n_iter, warps in itertools.product((16, 32, 64), (64, 128), (1, 4, 8, 16), (4,)):
            tiles = triton.cdiv(max(parts), bn)
            grid = (triton.cdiv(t, bm) + slots, triton.cdiv(tiles, n_iter) * len(parts))

            def run(bm=bm, bn=bn, n_iter=n_iter, warps=warps, tiles=tiles, grid=grid):
                lora._expand_kernel[grid](shrunk, lw.b, y, batch.order, batch.counts, batch.starts, lw.part_offsets,
                                          shrunk.stride(0), shrunk.stride(1), lw.b.stride(0), lw.b.stride(1),
                                          lw.b.stride(2), y.stride(0), y.stride(1), NUM_SLOTS=slots,
                                          TILES_PER_PART=tiles, N_ITER=n_iter, RANK=RANK, BLOCK_M=bm, BLOCK_N=bn,
                                          PARTS_ALIGNED=True, DOT_PRECISION="tf32", num_warps=warps)
            sweep.append((attempt(run), dict(bm=bm, bn=bn, n_iter=n_iter, warps=warps)))
        sweep.sort(key=lambda s: s[0])
        emit({"tokens": t, "slots": slots, "op": f"{name}.expand_sweep",
              "best": [dict(us=round(u, 1), **c) for u, c in sweep[:5]]})

with open(os.path.join(os.environ.get("OUT", "/tmp"), "lora_kernels.json"), "w") as f:
    json.dump(rows, f, indent=1)
