"""Where widening MXFP4 experts for a step pays: `fused_experts` on gpt-oss's expert shapes reading the packed
weights (widen=False) against widening each projection first (widen=True), over token counts, in CUDA graphs; and
the widening alone (bytes moved per second). The crossover is where MXFP4_WIDEN_SLOTS_PER_EXPERT belongs. JSON
lines on stdout, all of it in $OUT/mxfp4_widen_ab.json.

    EXPERTS=32 TOKENS=512,1024,2048,4096,8192,16384 python3 scripts/dev/mxfp4_widen_ab.py   # gpt-oss-20b's experts
"""
import json, os, sys
sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from triton.testing import do_bench_cudagraph
from moe_sweep import GPT_OSS_ACT as act, experts  # the sweep's random packed experts
from railyard.engine.runner.kernels import fused_moe
from railyard.engine.runner.kernels.mxfp4_widen import widen_mxfp4

E, H, I, K = int(os.environ.get("EXPERTS", "32")), 2880, 2880, 4
dev = "cuda"
torch.manual_seed(0)
q13, q2, s13, s2, b13, b2 = experts("mxfp4", E, H, I)


def timed(fn, rep_ms=20) -> float:
    """Device microseconds per call replayed in a CUDA graph for about rep_ms."""
    fn()
    return round(do_bench_cudagraph(fn, rep=rep_ms) * 1e3, 1)


widen_us = timed(lambda: widen_mxfp4(q13, s13, torch.bfloat16, kernel_layout=True))  # random bytes: any order
moved = q13.numel() + s13.numel() + 2 * q13.numel() * 2  # packed bytes and exponents read, two bf16 weights a byte written
rows = [{"widen_gate_up_us": widen_us, "gb_per_s": round(moved / widen_us / 1e3, 1)}]
print(json.dumps(rows[-1]), flush=True)
for T in [int(t) for t in os.environ.get("TOKENS", "512,1024,2048,4096,8192,16384").split(",")]:
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    top, ids = torch.topk(torch.randn(T, E, device=dev), K, dim=-1)
    w = torch.softmax(top, dim=-1).to(torch.bfloat16)
    call = lambda widen: fused_moe.fused_experts(x, q13, q2, w, ids, act, b13, b2, s13, s2, widen=widen,  # noqa: E731
                                                 kernel_layout=True)  # the engine's byte order
    a, b = call(False).float(), call(True).float()
    packed, widened = [timed(lambda: call(False)), timed(lambda: call(False))], [timed(lambda: call(True)),
                                                                                  timed(lambda: call(True))]
    rows.append({"tokens": T, "slots_per_expert": T * K // E, "packed_us": packed, "widened_us": widened,
                 "speedup": round(min(packed) / min(widened), 2), "default_widens": fused_moe.widens_mxfp4(T * K, E),
                 "rel_diff": round(((a - b).norm() / a.norm()).item(), 5)})
    print(json.dumps(rows[-1]), flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "mxfp4_widen_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)
