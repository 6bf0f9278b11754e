"""Each MXFP4 projection of gpt-oss-20b's experts alone (kernels/fused_moe.py's grouped_gemm: gate/up 2880 -> 5760,
down 2880 -> 2880, 32 experts, top-4, bf16 activations, random packed weights), tile by tile at decode token counts,
so that a tile can be picked per projection: microseconds per call (do_bench_cudagraph), the packed weights' bytes
the call reads per microsecond, and the relative error against the bf16 kernel on the widened weights; the bytes in
the kernel's order (as the engine holds them) and in the checkpoint's. Prints one JSON line per (tokens, projection) and writes $OUT/mxfp4_tiles.json.

    python3 scripts/dev/mxfp4_tiles.py --tokens 64,256,512 --configs "64x64x64 w4 s4,32x128x64 w4 s4"
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from railyard.engine.runner.kernels.fused_moe import grouped_gemm  # noqa: E402
from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, to_kernel_layout  # noqa: E402
from railyard.engine.runner.kernels.moe_align import align_by_expert  # noqa: E402
from railyard.engine.runner.layers.moe import route_softmax_topk  # noqa: E402
from railyard.model.spec import MXFP4_GROUP  # noqa: E402

E, TOP_K, H, I = 32, 4, 2880, 2880


def parse(name: str) -> tuple[int, int, int, int, int]:
    dims, warps, stages = name.split()
    bm, bn, bk = map(int, dims.split("x"))
    return bm, bn, bk, int(warps[1:]), int(stages[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="64,256,512")
    parser.add_argument("--configs", default="64x64x64 w4 s4")
    parser.add_argument("--layouts", default="kernel,checkpoint", help="comma-separated byte orders of the packed "
                        "weights: kernel (as the engine holds them, layers/mxfp4.py), checkpoint")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    projections = {}
    for name, n, k in (("gate_up", 2 * I, H), ("down", H, I)):
        projections[name] = (torch.randint(0, 256, (E, n, k // 2), device="cuda", dtype=torch.uint8, generator=gen),
                             torch.randint(118, 124, (E, n, k // MXFP4_GROUP), device="cuda", dtype=torch.uint8,
                                           generator=gen))
    results = {}
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        _, ids = route_softmax_topk(torch.randn(t, E, device="cuda"), TOP_K, True)
        hit = torch.unique(ids).numel()
        for name, (w, s) in projections.items():
            a = x if name == "gate_up" else torch.randn(t * TOP_K, I, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(t * TOP_K, w.shape[1], device="cuda", dtype=torch.bfloat16)
            row = {}
            div = TOP_K if name == "gate_up" else 1
            wide = dequantize_mxfp4(w, s, torch.bfloat16)
            want = torch.empty_like(out)
            grouped_gemm(a, wide, want, align_by_expert(ids, E, 64), div, (64, 64, 64, 4, 4))
            del wide
            for layout in args.layouts.split(","):
                stored = to_kernel_layout(w) if layout == "kernel" else w
                for cname in args.configs.split(","):
                    cfg = parse(cname)
                    routing = align_by_expert(ids, E, cfg[0])
                    key = f"{layout} {cname.strip()}"

                    def call():
                        return grouped_gemm(a, stored, out, routing, div, cfg, w_scale=s,
                                            kernel_layout=layout == "kernel")
                    try:
                        out.zero_()
                        call()
                        err = ((out.float() - want.float()).norm() / want.float().norm()).item()
                        us = do_bench_cudagraph(call) * 1e3
                    except Exception as exc:  # a tile that does not compile or fit: say so, go on
                        row[key] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        continue
                    read = hit * (w[0].numel() + s[0].numel())
                    row[key] = {"us": round(us, 1), "GBps": round(read / us / 1e3), "rel_err": round(err, 5)}
            key = f"T={t} {name}"
            results[key] = row
            print(json.dumps({key: row}), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "mxfp4_tiles.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
