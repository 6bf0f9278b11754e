"""SiLU-and-mul with its per-token FP8 quantization, kernel by kernel: the bf16 kernel it replaces before
an FP8 down projection, the two-pass quantizing kernel (each row's gate and up read twice) and the one-pass kernel
at several warp counts, for the qwen2-7b (intermediate 18,944) and qwen3-0.6b (3,072) widths at decode and prefill
row counts. Each timing is triton.testing.do_bench_cudagraph (replayed from a CUDA graph, as the engine runs them),
each quantizing variant's output checked bit for bit against the per-token quantization of the bf16 kernel's.
Prints one JSON object (microseconds; GB/s of the bytes a variant must move: gate and up read once, the output
written once) and writes it to $OUT/silu_quant.json.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from railyard.engine.runner.kernels import fp8 as fp8_kernels  # noqa: E402
from railyard.engine.runner.kernels import fused  # noqa: E402
from railyard.engine.runner.layers.fp8 import FP8_MAX, INV_FP8_MAX, MIN_SCALE  # noqa: E402

WIDTHS = {"qwen2-7b": 18944, "qwen3-0.6b": 3072}
ROWS = [1, 64, 256, 2048, 16384]
WARPS = [4, 8, 16, 32]


def launch(x: torch.Tensor, n: int, block: int, warps: int, one_pass: bool):
    t = x.shape[0]
    q = torch.empty((t, n), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((t, 1), dtype=torch.float32, device=x.device)

    def run():
        fused._silu_and_mul_quant_kernel[(t,)](x, q, s, x.stride(0), N=n, BLOCK=block, ONE_PASS=one_pass,
                                               ROUND_TO_ODD=False, FP8_MAX=FP8_MAX, INV_FP8_MAX=INV_FP8_MAX,
                                               MIN_SCALE=MIN_SCALE, num_warps=warps)
        return q, s
    return run


def main() -> None:
    torch.manual_seed(0)
    results: dict[str, dict] = {}
    for shape, n in WIDTHS.items():
        for t in ROWS:
            x = torch.randn(t, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
            want_q, want_s = fp8_kernels.quantize_per_token_triton(fused.silu_and_mul(x))
            moved = t * (2 * n * 2 + n)  # bytes: gate and up in bf16, the e4m3 output
            row = {"bf16 silu_and_mul": do_bench_cudagraph(lambda: fused.silu_and_mul(x)) * 1e3}
            two_block, two_warps = fp8_kernels.row_block_and_warps(n)
            variants = {"two-pass": (two_block, two_warps, False)}
            for w in WARPS:
                variants[f"one-pass {w} warps"] = (triton.next_power_of_2(n), w, True)
            block, warps, one_pass = fused.silu_quant_block_and_warps(n)
            default = f"{'one' if one_pass else 'two'}-pass {warps} warps"
            for name, (b, w, op) in variants.items():
                run = launch(x, n, b, w, op)
                try:
                    q, s = run()
                    torch.cuda.synchronize()
                    same = bool(torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s))
                    us = do_bench_cudagraph(run) * 1e3
                    row[name] = us
                    row[f"{name} bit-exact"] = same
                    row[f"{name} GB/s"] = round(moved / us / 1e3, 1)
                except Exception as exc:  # a warp count the compiler refuses at this width
                    row[name] = f"failed: {exc!r}"[:200]
            row["silu_and_mul_quant default"] = default
            row["silu_and_mul_quant (default) us"] = do_bench_cudagraph(lambda: fused.silu_and_mul_quant(x)) * 1e3
            results[f"{shape} rows={t}"] = row
            print(f"{shape} rows={t}: " + ", ".join(
                f"{k} {v:.1f}" for k, v in row.items() if isinstance(v, float) and "GB/s" not in k), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "silu_quant.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
