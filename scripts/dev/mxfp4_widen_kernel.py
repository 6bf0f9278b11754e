"""The MXFP4 widening kernel alone (kernels/mxfp4_widen.py) on gpt-oss-20b's experts (32 x 5,760 x 2,880 gate/up,
32 x 2,880 x 2,880 down; random packed bytes, kernel byte order), replayed in CUDA graphs: another checkout's kernel
file against this one's (medians of five interleaved timings, bit-equality checked), then this one's kernel at other
program shapes (rows, bytes, warps). JSON lines on stdout.

    BASELINE=/path/to/other/checkout python3 scripts/dev/mxfp4_widen_kernel.py
    TILES=8x512x4,4x512x4 python3 scripts/dev/mxfp4_widen_kernel.py   # no BASELINE: this checkout against itself
"""
import functools, json, os, sys
import torch
from triton.testing import do_bench_cudagraph

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_kernel_ab import load_kernel  # noqa: E402 (a kernel file imported under its own name)
KERNEL_FILE = "railyard/engine/runner/kernels/mxfp4_widen.py"
TILES = os.environ.get("TILES", "8x512x4,8x512x8,4x1024x4,8x1024x4,8x1024x8,16x512x8,4x512x4,2x1024x4,4x2048x8,"
                                "16x256x4")

old = load_kernel(os.path.join(os.environ.get("BASELINE", ROOT), KERNEL_FILE), 0)
new = load_kernel(os.path.join(ROOT, KERNEL_FILE), 1)
default = (new.BLOCK_ROWS, new.BLOCK_BYTES)
torch.manual_seed(0)
E, H, I = 32, 2880, 2880
for name, (e, n, k) in {"w13": (E, 2 * I, H), "w2": (E, H, I)}.items():
    packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    exps = torch.randint(118, 124, (e, n, k // 32), dtype=torch.uint8, device="cuda")
    moved = packed.numel() + exps.numel() + packed.numel() * 4  # bytes and exponents read, two bf16 weights a byte
    a = old.widen_mxfp4(packed, exps, torch.bfloat16, True)
    row = {"proj": name, "default": default,
           "equal": bool(torch.equal(a, new.widen_mxfp4(packed, exps, torch.bfloat16, True)))}
    ts = {"baseline": [], "here": []}
    for r in range(5):
        for tag, mod in (("baseline", old), ("here", new)) if r % 2 == 0 else (("here", new), ("baseline", old)):
            ts[tag].append(do_bench_cudagraph(lambda: mod.widen_mxfp4(packed, exps, torch.bfloat16, True)) * 1e3)
    for tag in ts:
        t = sorted(ts[tag])
        row[tag] = {"us_median": round(t[2], 1), "us_range": [round(t[0], 1), round(t[-1], 1)],
                    "GBps": round(moved / t[2] / 1e3)}
    print(json.dumps(row), flush=True)
    orig = new._widen_kernel
    for tile in filter(None, TILES.split(",")):
        rows_, bytes_, warps = (int(v) for v in tile.split("x"))
        new.BLOCK_ROWS, new.BLOCK_BYTES = rows_, bytes_

        class WithWarps:  # the launch, at this many warps
            def __getitem__(self, grid):
                return functools.partial(orig[grid], num_warps=warps)
        new._widen_kernel = WithWarps()
        try:
            fn = lambda: new.widen_mxfp4(packed, exps, torch.bfloat16, True)  # noqa: E731
            ok = torch.equal(fn(), a)
            us = sorted(do_bench_cudagraph(fn) * 1e3 for _ in range(3))[1]
            print(json.dumps({"proj": name, "tile": [rows_, bytes_, warps], "equal": ok, "us": round(us, 1),
                              "GBps": round(moved / us / 1e3)}), flush=True)
        except Exception as exc:  # a shape the compiler refuses is a result too
            print(json.dumps({"proj": name, "tile": [rows_, bytes_, warps], "error": repr(exc)[:150]}), flush=True)
        finally:
            new._widen_kernel = orig
    new.BLOCK_ROWS, new.BLOCK_BYTES = default
