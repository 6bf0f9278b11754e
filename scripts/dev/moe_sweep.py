"""The fused-MoE kernel (kernels/fused_moe.py) tile by tile on Qwen3-30B-A3B's experts (128 experts of 2048 -> 768,
top-8), bf16 and FP8 (128 x 128 block scales), at decode and prefill token counts, under uniform random routing.
Each timing is triton.testing.do_bench_cudagraph of the whole experts call (routing sort, both grouped GEMMs, the
activation, the weighted sum), as the engine's CUDA graphs run it; each result is checked against the torch
reference first. Prints one JSON object (microseconds, GB/s of the expert weights the tokens' experts hold, TFLOP/s
of the active experts' FLOPs, and which tile pick_config chooses) and writes it to $OUT/moe_sweep.json.

    python3 scripts/dev/moe_sweep.py            # on the GPU machine; about a minute
"""

from __future__ import annotations

import json
import os
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

E, K, H, I = 128, 8, 2048, 768
TOKENS = [1, 8, 64, 256, 2048, 16384]
CONFIGS = {  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    "16x64x128 w4 s4": (16, 64, 128, 4, 4), "16x128x128 w4 s3": (16, 128, 128, 4, 3),
    "32x64x128 w4 s4": (32, 64, 128, 4, 4), "64x128x64 w8 s3": (64, 128, 64, 8, 3),
    "64x128x128 w8 s3": (64, 128, 128, 8, 3), "128x128x64 w8 s3": (128, 128, 64, 8, 3),
}


def experts(fp8: bool):
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    if not fp8:
        return w13, w2, None, None
    q13, q2 = torch.empty(w13.shape, dtype=FP8, device="cuda"), torch.empty(w2.shape, dtype=FP8, device="cuda")
    s13 = torch.empty(E, *block_scale_shape(2 * I, H, I), device="cuda")
    s2 = torch.empty(E, *block_scale_shape(H, I), device="cuda")
    quantize_experts(w13, q13, s13)
    quantize_experts(w2, q2, s2)
    return q13, q2, s13, s2


def main() -> None:
    out_dir = os.environ.get("OUT", "/tmp")
    results: dict[str, dict] = {"device": torch.cuda.get_device_name(), "shape": dict(E=E, k=K, H=H, I=I)}
    for fp8 in (False, True):
        w13, w2, s13, s2 = experts(fp8)
        bytes_per_expert = 3 * H * I * (1 if fp8 else 2)
        for t in TOKENS:
            x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
            weights, ids = route_softmax_topk(torch.randn(t, E, device="cuda"), K, True)
            weights = weights.to(torch.bfloat16)
            hit = torch.unique(ids).numel()
            flops = 2 * t * K * 3 * H * I
            if fp8:
                want = experts_reference_fp8(x, w13, s13, w2, s2, weights, ids)
            else:
                want = experts_reference(x, w13, w2, weights, ids)
            row = {"experts_hit": hit, "pick_config": fused_moe.pick_config(t * K, E, fp8)}
            for name, cfg in CONFIGS.items():
                if fp8 and cfg[2] != 128:
                    continue
                call = lambda: fused_moe.fused_experts(x, w13, w2, weights, ids, silu_and_mul, None, None,  # noqa
                                                       s13, s2, config=cfg)
                err = ((call().float() - want.float()).norm() / want.float().norm()).item()
                us = do_bench_cudagraph(call) * 1e3
                row[name] = {"us": round(us, 1), "rel_err": round(err, 5),
                             "weights_GBps": round(hit * bytes_per_expert / us / 1e3, 1),
                             "TFLOPs": round(flops / us / 1e6, 1)}
            results[f"{'fp8' if fp8 else 'bf16'} T={t}"] = row
            print(json.dumps({f"{'fp8' if fp8 else 'bf16'} T={t}": row}), file=sys.stderr, flush=True)
    with open(os.path.join(out_dir, "moe_sweep.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
