"""Copies of the fused-MoE kernel file against each other on gpt-oss-20b's MXFP4 experts (gate/up 2880 -> 5760, down
2880 -> 2880, 32 experts, top-4, bf16 activations, moe_sweep.py's random packed weights): each file's grouped_gemm on
the same inputs and tiles, microseconds per call in CUDA graphs, the files' timings interleaved over rounds
(alternating order) so that a drift of the card's clocks falls on all of them; the packed bytes each call reads per
microsecond; each output against the first file's (a kernel change that keeps the arithmetic gives 0.0) and, as a
relative norm error, against the engine's bf16 kernel on the widened weights. A tile a file's grouped_gemm does not
take is skipped. --layouts times the weights' bytes in the kernel's order (as the engine holds them, layers/mxfp4.py)
and/or the checkpoint's, and/or `widened`: the bf16 weights widened beforehand, the dense-weight GEMM a long prefill
takes (kernels/mxfp4_widen.py), with the active experts' TFLOP/s and, as a control, cuBLAS's batched GEMM of the same
FLOPs (torch.bmm, every expert given the average number of slots: what the grouped GEMM's tile could reach).

Why: a kernel change to judge is a copy of kernels/fused_moe.py with the change; timing the copies in one process
on one card is the A/B that separate calls (other machines, other clocks) cannot give. With the one default file it
times tiles against each other, which is how the MXFP4 tile table was picked.

    python3 scripts/dev/moe_kernel_ab.py --plan "512:64,64,64,4,4;64,128,64,4,3|1024:128,128,64,8,3"
    python3 scripts/dev/moe_kernel_ab.py --kernels railyard/engine/runner/kernels/fused_moe.py,/tmp/changed.py
    python3 scripts/dev/moe_kernel_ab.py --plan "256:64,64,64,4,4" --layouts kernel,checkpoint
    python3 scripts/dev/moe_kernel_ab.py --plan "16384:128,256,64,8,4;128,128,64,4,4" --layouts widened
--plan: tokens:tile;tile|tokens:... (a tile is BLOCK_M,BLOCK_N,BLOCK_K,warps,stages). JSON lines on stdout (median
microseconds per file), everything in $OUT/moe_kernel_ab.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from moe_kernel_resources import parse_tiles  # noqa: E402
from moe_sweep import GPT_OSS_ACT, experts  # noqa: E402 (the sweep's random packed experts, gpt-oss's activation)
from railyard.engine.runner.kernels.fused_moe import epilogue_activation, grouped_gemm  # noqa: E402
from railyard.engine.runner.kernels.moe_align import align_by_expert  # noqa: E402
from railyard.engine.runner.layers.moe import route_softmax_topk  # noqa: E402
from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, to_kernel_layout  # noqa: E402

E, TOP_K, H, I = 32, 4, 2880, 2880
DEFAULT_KERNEL = os.path.join(__file__.rsplit("/scripts/", 1)[0], "railyard/engine/runner/kernels/fused_moe.py")


def parse_plan(text: str) -> dict[int, tuple[tuple[int, ...], ...]]:
    """'256:64,128,64,4,4;64,64,64,4,4|512:...' -> {256: ((64, 128, 64, 4, 4), (64, 64, 64, 4, 4)), 512: (...)}; the
    tiles as moe_kernel_resources.py's --tiles reads them."""
    return {int(tokens): parse_tiles(tiles) for tokens, tiles in (part.split(":") for part in text.split("|"))}


def load_kernel(path: str, index: int):
    """The module a kernel file defines, imported under its own name (two copies of one file do not clash)."""
    spec = importlib.util.spec_from_file_location(f"moe_kernel_ab_{index}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(a: torch.Tensor, widened: torch.Tensor, ids: torch.Tensor, row_div: int, gated=None) -> torch.Tensor:
    """The projection by the engine's bf16 grouped GEMM on the weights widened beforehand: what every tile should
    give, up to the order of the K sums."""
    out = torch.empty(a.shape[0] * row_div, widened.shape[1] // (2 if gated else 1), device="cuda",
                      dtype=torch.bfloat16)
    return grouped_gemm(a, widened, out, align_by_expert(ids, E, 64), row_div, (64, 64, 64, 4, 4), gated=gated)


def ab_tile(kernels: dict, a: torch.Tensor, w: torch.Tensor, s: torch.Tensor, routing, row_div: int, tile: tuple,
            in_kernel_order: bool, rounds: int, want: torch.Tensor, read: int, flops: float,
            gated=None) -> dict[str, dict]:
    """One projection at one tile through every kernel file: its timings (rounds interleaved, alternating order), the
    packed bytes it reads per microsecond, and its output against the first file's and against the reference."""
    outs = {}
    s = None if w.dtype == torch.bfloat16 else s  # widened weights: the bf16 kernel
    kw = {"gated": gated} if gated else {}  # a file from before the gated epilogue takes no such argument
    for path, module in kernels.items():
        out = torch.zeros(a.shape[0] * row_div, w.shape[1] // (2 if gated else 1), device="cuda", dtype=torch.bfloat16)
        try:
            module.grouped_gemm(a, w, out, routing, row_div, tile, w_scale=s, kernel_layout=in_kernel_order, **kw)
        except Exception as exc:  # a file whose grouped_gemm does not take this tile
            print(f"{path} {tile}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        torch.cuda.synchronize()
        outs[path] = out
    times = {path: [] for path in outs}
    for r in range(rounds):
        for path in (list(outs) if r % 2 == 0 else list(outs)[::-1]):
            module, out = kernels[path], outs[path]
            times[path].append(do_bench_cudagraph(lambda: module.grouped_gemm(
                a, w, out, routing, row_div, tile, w_scale=s, kernel_layout=in_kernel_order, **kw)) * 1e3)
    first = next(iter(outs.values()), None)
    row = {}
    for path, ts in times.items():
        got = outs[path].float()
        median = statistics.median(ts)
        row[path] = {"us_median": round(median, 1), "us": [round(t, 1) for t in ts],
                     "packed_GBps": round(read / median / 1e3), "TFLOPs": round(flops / median / 1e6, 1),
                     "max_abs_diff_vs_first": float((got - first.float()).abs().max()),
                     "rel_err_vs_widened": round(((got - want).norm() / want.norm()).item(), 5)}
    return row


def cublas_control(widened: torch.Tensor, tokens: int, flops: float) -> dict[str, float]:
    """torch.bmm over the experts, each given tokens * TOP_K / E rows: the same FLOPs as the grouped GEMM with
    perfectly even routing and no gather, microseconds and TFLOP/s."""
    rows = -(-tokens * TOP_K // E)
    a = torch.randn(E, rows, widened.shape[2], device="cuda", dtype=torch.bfloat16)
    b = widened.transpose(1, 2)
    us = do_bench_cudagraph(lambda: torch.bmm(a, b)) * 1e3
    return {"us": round(us, 1), "TFLOPs": round(flops / us / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=DEFAULT_KERNEL,
                        help="comma-separated kernel files (copies of fused_moe.py)")
    parser.add_argument("--plan", type=parse_plan, default="256:64,128,64,4,4|512:128,128,64,8,3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gated", action="store_true", help="the gate/up GEMM with gpt-oss's clamped SwiGLU in its "
                        "epilogue, as fused_experts runs it (else its [slots, 2I] projection stored)")
    parser.add_argument("--layouts", default="kernel", help="comma-separated byte orders of the packed weights: "
                        "kernel (as the engine holds them), checkpoint")
    args = parser.parse_args()
    kernels = {path: load_kernel(path, i) for i, path in enumerate(args.kernels.split(","))}
    w13, w2, s13, s2, *_ = experts("mxfp4", E, H, I)
    layouts = args.layouts.split(",")
    projections = {}  # name -> (weights by byte order, exponents, the bf16 weights, packed bytes an expert holds)
    for name, packed, s in (("gate_up", w13, s13), ("down", w2, s2)):
        widened = dequantize_mxfp4(packed, s, torch.bfloat16)
        stored = {layout: to_kernel_layout(packed) if layout == "kernel" else widened if layout == "widened" else packed
                  for layout in layouts}
        projections[name] = (stored, s, widened, packed[0].numel() + s[0].numel())
    results = {}
    for tokens, tiles in args.plan.items():
        torch.manual_seed(tokens)
        x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
        _, ids = route_softmax_topk(torch.randn(tokens, E, device="cuda"), TOP_K, True)
        hit = torch.unique(ids).numel()
        for name, (stored, s, widened, expert_bytes) in projections.items():
            a = x if name == "gate_up" else torch.randn(tokens * TOP_K, I, device="cuda", dtype=torch.bfloat16)
            row_div = TOP_K if name == "gate_up" else 1
            gated = epilogue_activation(GPT_OSS_ACT) if args.gated and name == "gate_up" else None
            want = reference(a, widened, ids, row_div, gated).float()
            read = hit * expert_bytes
            flops = 2.0 * tokens * TOP_K * widened.shape[1] * widened.shape[2]
            if "widened" in layouts:
                print(json.dumps({f"T={tokens} {name} cuBLAS bmm control": cublas_control(widened, tokens, flops)}),
                      flush=True)
            for layout, w in stored.items():
                for tile in tiles:
                    row = ab_tile(kernels, a, w, s, align_by_expert(ids, E, tile[0]), row_div, tile,
                                  layout == "kernel", args.rounds, want, read, flops, gated)
                    key = f"T={tokens} {name} {tile}" + (f" {layout} order" if len(layouts) > 1 else "")
                    results[key] = row
                    summary = {path: (r["us_median"], r["max_abs_diff_vs_first"], r["TFLOPs"]) for path, r in row.items()}
                    print(json.dumps({key: summary}), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_kernel_ab.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
