"""Sweep the paged decode kernel's launch configuration on the benchmark's decode shape and print the
fastest (GPU time per call, CUDA events); every configuration's output is checked against the default.

Usage: python3 scripts/gpu/tune_decode.py [fp8]  -> $OUT/tune_decode.json ($OUT/tune_decode_fp8.json)
fp8: the cache in float8_e4m3fn (issue 15's FP8 KV: half the bytes per token, so the default 64-token tiles move
half as much per loop iteration as a bf16 cache's), with narrower and wider tiles, more splits and register caps
(maxnreg: scripts/decode_kernel_resources.py counts the registers that limit programs per SM) in the sweep.
"""

from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402

from railyard.engine.kernels.paged_attention import decode_stages, paged_decode  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
PAGE, BATCH = 16, 256
SHAPES = {"qwen2-7b": (28, 4, 128), "qwen3-0.6b": (16, 8, 128)}  # heads, kv heads, head dim


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
    for name, (h, hk, d) in SHAPES.items():
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
        ref = paged_decode(q, cache, tables, seq_lens, scale, 1)
        kv_bytes = sum(lens) * hk * d * 2 * cache.element_size()
        rows = []
        # One and two warps a program too: with 16 query rows the 4-warp layout splits each tile's tokens across
        # warps, so every tile's softmax max and sum and its P tile cross warps through shared memory (barriers);
        # one warp keeps them in registers, more programs (and splits) keep the SMs full. (The 2026-12-04 sweeps,
        # the FP8 one over value blocks kept tokens innermost, since reverted: nothing beat the 4-warp default by
        # more than ~9%; the kernel is bound by instructions per token, BENCHMARKS.md.)
        narrow = [(s, bn, w, st, None) for w, blocks in ((1, (16, 32)), (2, (32, 64))) for s in (1, 2, 4)
                  for bn in blocks for st in (2, 3)]
        if fp8:  # 4 warps: one split (the 2026-12-04 sweeps: more splits, 8 warps, 128- and 256-token tiles slower)
            grid = [(1, 64, 4, st, cap) for st in (2, 3) for cap in (None, 96)] + narrow
        else:
            # 4 warps: the default and 3 stages (issue 7's sweep of splits 1-2, tiles 32-128, 2-8 warps, 2-3 stages
            # found nothing worth a change over the default)
            grid = [(1, 64, 4, st, None) for st in (2, 3)] + narrow
        for splits, block_n, warps, stages, cap in grid:
            config = dict(splits=splits, block_n=block_n, warps=warps, stages=stages, maxnreg=cap)
            try:
                out = paged_decode(q, cache, tables, seq_lens, scale, splits, block_n=block_n, num_warps=warps,
                                   num_stages=stages, maxnreg=cap)
                diff = (out.float() - ref.float()).abs().max().item()
                us = timed(lambda: paged_decode(q, cache, tables, seq_lens, scale, splits, block_n=block_n,
                                                num_warps=warps, num_stages=stages, maxnreg=cap))
            except Exception as exc:  # a configuration that does not compile (shared memory) is skipped
                rows.append(dict(config, error=repr(exc)[:120]))
                continue
            rows.append(dict(config, us=round(us, 1), tb_s=round(kv_bytes / us / 1e6, 2), max_diff=diff))
        ok = [r for r in rows if "us" in r and r["max_diff"] < 0.02]
        ok.sort(key=lambda r: r["us"])
        default = next(r for r in rows if (r["splits"], r["block_n"], r["warps"], r["stages"], r["maxnreg"])
                       == (1, 64, 4, decode_stages(cache), None))
        results[name] = dict(kv_mb=round(kv_bytes / 1e6, 1), width=width, default=default, best=ok[:8],
                             errors=sum(1 for r in rows if "error" in r))
        print(name, "default", default, "\n best", ok[:5], flush=True)
    with open(os.path.join(OUT, "tune_decode_fp8.json" if fp8 else "tune_decode.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
