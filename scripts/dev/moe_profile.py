"""Where one MoE layer's time goes on the GPU, kernel by kernel: torch.profiler over the router GEMM, the fused
routing, the grouping by expert and the fused experts (kernels/fused_moe.py, the tile pick_config chooses) on
Qwen3-30B-A3B's shape (128 experts of 2048 -> 768, top-8, bf16), at decode and prefill token counts. Prints one
JSON object (per token count: microseconds per layer call, and each kernel's microseconds and launches per call)
and writes it to $OUT/moe_profile.json.

    python3 scripts/dev/moe_profile.py [--tokens 256,16384]   # on the GPU machine; about 20 s
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from railyard.engine.runner.kernels import fused_moe  # noqa: E402
from railyard.engine.runner.layers.activation import silu_and_mul  # noqa: E402

E, K, H, I = 128, 8, 2048, 768
REPEATS = 10


def device_us(event) -> float:
    return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)


def profile_layer(tokens: int, gate: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> dict:
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)

    def call():
        weights, ids = fused_moe.route_softmax_topk(x @ gate.T, K, True)
        return fused_moe.fused_experts(x, w13, w2, weights, ids, silu_and_mul)

    for _ in range(3):  # compile and warm up outside the profile
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            call()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.key_averages() if device_us(e) > 0), key=device_us, reverse=True)
    rows = {e.key[:90]: {"us": round(device_us(e) / REPEATS, 1), "launches": e.count / REPEATS} for e in kernels}
    return {"config": fused_moe.pick_config(tokens * K, E, False),
            "us_per_layer": round(sum(device_us(e) for e in kernels) / REPEATS, 1), "kernels": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="256,16384", help="comma-separated token counts")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    results = {"device": torch.cuda.get_device_name()}
    for t in (int(v) for v in args.tokens.split(",")):
        results[f"T={t}"] = profile_layer(t, gate, w13, w2)
        print(json.dumps({f"T={t}": results[f"T={t}"]}), file=sys.stderr, flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_profile.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
