"""Sweep the paged decode kernel's launch configuration on the benchmark's decode shape and print the
fastest (GPU time per call, CUDA events); every configuration's output is checked against the default.

Usage: python3 scripts/dev/tune_decode.py [fp8]  -> $OUT/tune_decode.json ($OUT/tune_decode_fp8.json)
SHAPES=gpt-oss-20b,gpt-oss-20b-sliding (environment; default qwen2-7b,qwen3-0.6b): the shapes swept; gpt-oss's
layers attend with learned sinks, its sliding ones over a 128-token window; a shape of head dim 64 or one under a
window sweeps splits, tile lengths, warps and stages over a bf16 cache too (the defaults were tuned at head dim 128).
The calls are launched back to back from Python: one shorter than its launch on the host (a 128-token window's) times
the launch, not the kernel (the engine replays them in CUDA graphs; profile_steps.py times those).
fp8: the cache in float8_e4m3fn (an FP8 KV cache: half the bytes per token, so the default 64-token tiles move
half as much per loop iteration as a bf16 cache's), with narrower and wider tiles, more splits and register caps
(maxnreg: scripts/dev/decode_kernel_resources.py counts the registers that limit programs per SM) in the sweep.
"""

from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402

from railyard.engine.runner.kernels.paged_attention import decode_stages, paged_decode  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
PAGE, BATCH = 16, 256
# heads, kv heads, head dim, sliding window (0: none), learned sinks
SHAPES = {"qwen2-7b": (28, 4, 128, 0, False), "qwen3-0.6b": (16, 8, 128, 0, False),
          "gpt-oss-20b": (64, 8, 64, 0, True), "gpt-oss-20b-sliding": (64, 8, 64, 128, True)}


def timed(fn, iters: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1000  # us


def main() -> None:
    fp8 = sys.argv[1:] == ["fp8"]
    rng = random.Random(0)
    lens = [rng.randint(100, 1024) + 150 for _ in range(BATCH)]  # mid-run: prompt + 150 outputs
    results = {}
    for name in os.environ.get("SHAPES", "qwen2-7b,qwen3-0.6b").split(","):
        h, hk, d, window, has_sinks = SHAPES[name]
        pages = [-(-n // PAGE) for n in lens]
        total = sum(pages)
        cache = torch.randn((2, total + 8, PAGE, hk, d), dtype=torch.bfloat16, device="cuda")
        if fp8:
            cache = cache.to(torch.float8_e4m3fn)
        perm = torch.randperm(total + 8)[:total].tolist()  # scattered pages, as a busy pool has them
        width = max(pages)
        tables = torch.zeros((BATCH, 2048), dtype=torch.int32)  # graph buffers are max_model_len wide
        at = 0
        for i, n in enumerate(pages):
            tables[i, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
            at += n
        tables = tables.cuda()
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        q = torch.randn((BATCH, h, d), dtype=torch.bfloat16, device="cuda")
        scale = d ** -0.5
        attn = dict(window=window, sinks=torch.randn(h, device="cuda") if has_sinks else None)
        ref = paged_decode(q, cache, tables, seq_lens, scale, 1, use_fp8_dots=False if fp8 else None, **attn)
        kv_bytes = sum(min(n, window or n) for n in lens) * hk * d * 2 * cache.element_size()
        rows = []
        # (splits, block_n, warps, stages, maxnreg, fp8 dots). The 2026-12-04 sweeps of the float16-dots kernel (1-2
        # warps, 16-64-token tiles, 1-4 splits, 2-3 stages, register caps, value layouts): nothing beat its 4-warp
        # default by more than ~9%, bound by instructions per token (BENCHMARKS.md). Over an FP8 cache the sweep now
        # sets that default beside the FP8-dots kernel (64 tokens = wgmma's M; 4 warps = one warpgroup).
        if fp8:
            grid = [(1, 64, 4, decode_stages(cache), None, False)]
            grid += [(s, bn, 4, st, None, True) for s in (1, 2) for bn in (64, 128) for st in (2, 3, 4)]
        elif d < 128 or window:
            grid = [(1, 64, 4, decode_stages(cache), None, None)]
            grid += [(sp, bn, w, st, None, None) for sp in (1, 2, 4) for bn in (32, 64, 128) for w in (2, 4, 8)
                     for st in (2, 3)]
        else:
            grid = [(1, 64, 4, st, None, None) for st in (2, 3)]
        for splits, block_n, warps, stages, cap, dots in grid:
            config = dict(splits=splits, block_n=block_n, warps=warps, stages=stages, maxnreg=cap, fp8_dots=dots)
            run = dict(block_n=block_n, num_warps=warps, num_stages=stages, maxnreg=cap, use_fp8_dots=dots, **attn)
            try:
                out = paged_decode(q, cache, tables, seq_lens, scale, splits, **run)
                diff = (out.float() - ref.float()).abs().max().item()
                rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                us = timed(lambda: paged_decode(q, cache, tables, seq_lens, scale, splits, **run))
            except Exception as exc:  # a configuration that does not compile (shared memory) is skipped
                rows.append(dict(config, error=repr(exc)[:120]))
                continue
            rows.append(dict(config, us=round(us, 1), tb_s=round(kv_bytes / us / 1e6, 2), max_diff=diff,
                             rel_l2=round(rel, 5)))
        ok = [r for r in rows if "us" in r and r["rel_l2"] < 0.05]  # FP8 dots: e4m3 q and P, ~1-3% (the tests)
        ok.sort(key=lambda r: r["us"])
        # the reference row: over an FP8 cache the float16-dots kernel (grid[0]; Hopper's default is FP8 dots)
        default = next(r for r in rows if tuple(r[k] for k in ("splits", "block_n", "warps", "stages", "maxnreg",
                                                                 "fp8_dots")) == grid[0])
        results[name] = dict(kv_mb=round(kv_bytes / 1e6, 1), width=width, default=default, best=ok[:8],
                             errors=sum(1 for r in rows if "error" in r))
        print(name, "default", default, "\n best", ok[:5], flush=True)
        with open(os.path.join(OUT, "tune_decode_fp8.json" if fp8 else "tune_decode.json"), "w") as f:
            json.dump(results, f, indent=1)  # after each shape, so a cut-short sweep keeps what it timed


if __name__ == "__main__":
    main()
