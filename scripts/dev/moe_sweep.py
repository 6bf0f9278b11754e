"""The fused-MoE kernel (kernels/fused_moe.py) tile by tile on real expert shapes, at decode and prefill token counts,
under uniform random routing:
- bf16 and fp8 (128 x 128 block scales) on Qwen3-30B-A3B's experts (128 of 2048 -> 768, top-8, SiLU);
- mxfp4 on gpt-oss-20b's (32 of 2880 -> 2880, top-4) and gpt-oss-120b's (128 of them), with expert biases and the
  clamped SwiGLU, the weights read packed by the kernel; each row also times the control `widened`: the layer's
  experts widened to bf16 and the bf16 kernel (what the layer did before the kernel read MXFP4), and with --tp N
  the rank-0 slice of N ranks (2880 / N padded to whole 32-groups, as layers/moe.py holds it).
Each timing is triton.testing.do_bench_cudagraph of the whole experts call (routing sort, both grouped GEMMs, the
activation, the weighted sum), as the engine's CUDA graphs run it; each result is first checked against the torch
reference (rel_err: relative norm error). Prints one JSON object (microseconds, GB/s of the expert weights the
tokens' experts hold as stored, TFLOP/s of the active experts' FLOPs, and which tile pick_config chooses) and writes
it to $OUT/moe_sweep.json.

    python3 scripts/dev/moe_sweep.py                      # all modes on the GPU machine; a few minutes
    python3 scripts/dev/moe_sweep.py --modes mxfp4 --tp 4  # gpt-oss's experts as one of 4 ranks holds them
    python3 scripts/dev/moe_sweep.py --modes mxfp4 --shapes gpt-oss-20b --tokens 64,256 \
        --configs "16x64x128 w4 s3,32x64x64 w4 s4"            # these tiles instead of CONFIGS
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from railyard.engine.runner.kernels import fused_moe  # noqa: E402
from railyard.engine.runner.layers.activation import silu_and_mul  # noqa: E402
from railyard.engine.runner.layers.fp8 import FP8  # noqa: E402
from railyard.engine.runner.layers.fp8_block import block_scale_shape  # noqa: E402
from railyard.engine.runner.layers.moe import (experts_reference, experts_reference_fp8,  # noqa: E402
                                               quantize_experts, route_softmax_topk)
from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, to_kernel_layout  # noqa: E402
from railyard.engine.runner.layers.activation import ClampedSwiGLU  # noqa: E402
from railyard.model.spec import MXFP4_GROUP, MXFP4_WEIGHT_BYTES, expert_shard  # noqa: E402

QWEN3 = dict(E=128, K=8, H=2048, I=768)
SHAPES = {"bf16": {"qwen3-30b-a3b": QWEN3}, "fp8": {"qwen3-30b-a3b": QWEN3},
          "mxfp4": {"gpt-oss-20b": dict(E=32, K=4, H=2880, I=2880), "gpt-oss-120b": dict(E=128, K=4, H=2880, I=2880)}}
TOKENS = [1, 8, 64, 256, 2048, 16384]
CONFIGS = {  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); kernels/fused_moe.py's TILES among them
    "16x64x128 w4 s3": (16, 64, 128, 4, 3), "16x128x128 w4 s2": (16, 128, 128, 4, 2),
    "16x128x128 w4 s3": (16, 128, 128, 4, 3), "32x256x128 w4 s2": (32, 256, 128, 4, 2),
    "64x128x64 w4 s3": (64, 128, 64, 4, 3), "64x128x128 w4 s4": (64, 128, 128, 4, 4),
    "128x128x64 w8 s3": (128, 128, 64, 8, 3), "128x256x64 w8 s4": (128, 256, 64, 8, 4),
    "16x64x64 w4 s3": (16, 64, 64, 4, 3), "16x128x64 w4 s3": (16, 128, 64, 4, 3),
    "64x128x64 w8 s3": (64, 128, 64, 8, 3),
}
GPT_OSS_ACT = ClampedSwiGLU(1.702, 7.0)  # as the gpt-oss layer holds it: run in the gate/up epilogue


def experts(mode: str, E: int, H: int, I: int):  # noqa: E741 (the shape's names)
    """(w13, w2, w13_scale, w2_scale, w13_bias, w2_bias) as the layer holds them in `mode`."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    if mode == "mxfp4":  # random e2m1 pairs, exponents around 2^-6 (|w| up to ~0.1), as checkpoints' magnitudes
        def packed(n, k):
            return (torch.randint(0, 256, (E, n, k // 2), device="cuda", dtype=torch.uint8, generator=gen),
                    torch.randint(118, 124, (E, n, k // MXFP4_GROUP), device="cuda", dtype=torch.uint8,
                                  generator=gen))
        (w13, s13), (w2, s2) = packed(2 * I, H), packed(H, I)
        b13 = torch.randn(E, 2 * I, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
        b2 = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
        return w13, w2, s13, s2, b13, b2
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    if mode == "bf16":
        return w13, w2, None, None, None, None
    q13, q2 = torch.empty(w13.shape, dtype=FP8, device="cuda"), torch.empty(w2.shape, dtype=FP8, device="cuda")
    s13 = torch.empty(E, *block_scale_shape(2 * I, H, I), device="cuda")
    s2 = torch.empty(E, *block_scale_shape(H, I), device="cuda")
    quantize_experts(w13, q13, s13)
    quantize_experts(w2, q2, s2)
    return q13, q2, s13, s2, None, None


def parse_config(name: str) -> tuple[int, int, int, int, int]:
    """"16x64x128 w4 s3" -> (16, 64, 128, 4, 3): a tile named as CONFIGS' keys are."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+) w(\d+) s(\d+)", name.strip())
    if match is None:
        raise SystemExit(f"moe_sweep: a tile is named like '16x64x128 w4 s3', not {name!r}")
    bm, bn, bk, warps, stages = map(int, match.groups())
    return bm, bn, bk, warps, stages


def sweep(mode: str, shape: dict, tokens: list[int], results: dict, name: str) -> None:
    E, K, H, I = shape["E"], shape["K"], shape["H"], shape["I"]  # noqa: E741
    w13, w2, s13, s2, b13, b2 = experts(mode, E, H, I)
    act = GPT_OSS_ACT if mode == "mxfp4" else silu_and_mul
    bytes_per_weight = {"bf16": 2, "fp8": 1, "mxfp4": MXFP4_WEIGHT_BYTES}[mode]
    bytes_per_expert = 3 * H * I * bytes_per_weight
    for t in tokens:
        x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
        weights, ids = route_softmax_topk(torch.randn(t, E, device="cuda"), K, True)
        weights = weights.to(torch.bfloat16)
        hit = torch.unique(ids).numel()
        flops = 2 * t * K * 3 * H * I
        if mode == "fp8":
            want = experts_reference_fp8(x, w13, s13, w2, s2, weights, ids)
        elif mode == "mxfp4":
            want = experts_reference(x, dequantize_mxfp4(w13, s13, x.dtype), dequantize_mxfp4(w2, s2, x.dtype),
                                     weights, ids, act, b13, b2)
        else:
            want = experts_reference(x, w13, w2, weights, ids)
        row = {"experts_hit": hit, "pick_config": fused_moe.pick_config(t * K, E, mode == "fp8", mode == "mxfp4")}

        def measure(call):
            err = ((call().float() - want.float()).norm() / want.float().norm()).item()
            us = do_bench_cudagraph(call) * 1e3
            return {"us": round(us, 1), "rel_err": round(err, 5),
                    "weights_GBps": round(hit * bytes_per_expert / us / 1e3, 1), "TFLOPs": round(flops / us / 1e6, 1)}

        arranged = mode == "mxfp4"  # MXFP4 bytes in the fused kernel's order, as the engine holds them
        k13, k2 = (to_kernel_layout(w13), to_kernel_layout(w2)) if arranged else (w13, w2)
        for cname, cfg in CONFIGS.items():
            if mode == "fp8" and cfg[2] != 128:
                continue
            row[cname] = measure(lambda: fused_moe.fused_experts(x, k13, k2, weights, ids, act, b13, b2,  # noqa
                                                                 s13, s2, config=cfg, kernel_layout=arranged))
        row["picked"] = measure(lambda: fused_moe.fused_experts(x, k13, k2, weights, ids, act, b13, b2, s13, s2,
                                                                kernel_layout=arranged))
        del k13, k2
        if mode == "mxfp4":  # the control: the whole layer widened, then the bf16 kernel
            wide13, wide2 = dequantize_mxfp4(w13, s13, x.dtype), dequantize_mxfp4(w2, s2, x.dtype)
            row["widened"] = measure(lambda: fused_moe.fused_experts(x, wide13, wide2, weights, ids, act, b13, b2))
            del wide13, wide2
        key = f"{mode} {name} T={t}"
        results[key] = row
        print(json.dumps({key: row}), file=sys.stderr, flush=True)
    del w13, w2, s13, s2
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="bf16,fp8,mxfp4", help="comma-separated: bf16, fp8, mxfp4")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts")
    parser.add_argument("--tp", type=int, default=1, help="mxfp4: time rank 0's slice of this many ranks")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: every shape of a mode)")
    parser.add_argument("--configs", default="", help="comma-separated tiles to time instead of CONFIGS, "
                                                      "each named like '16x64x128 w4 s3'")
    args = parser.parse_args()
    if args.configs:
        CONFIGS.clear()
        CONFIGS.update({name.strip(): parse_config(name) for name in args.configs.split(",") if name.strip()})
    wanted = {name for name in args.shapes.split(",") if name}
    tokens = [int(t) for t in args.tokens.split(",")]
    out_dir = os.environ.get("OUT", "/tmp")
    results: dict[str, dict] = {"device": torch.cuda.get_device_name(), "tp": args.tp}
    for mode in args.modes.split(","):
        for name, shape in SHAPES[mode].items():
            if wanted and name not in wanted:
                continue
            if mode == "mxfp4" and args.tp > 1:
                shape = dict(shape, I=expert_shard(shape["I"], args.tp, 0, MXFP4_GROUP).held)
            results[f"shape {mode} {name}"] = shape
            sweep(mode, shape, tokens, results, name)
    with open(os.path.join(out_dir, "moe_sweep.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
