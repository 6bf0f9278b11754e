"""A/B of the MXFP4 fused experts on the GPU: a previous fused_moe.py against the current one on the same weights,
gpt-oss-20b's expert shapes, bf16, top-4 of 32: device microseconds per `fused_experts` call (in CUDA graphs) and the
outputs' relative difference, beside the same call on bf16 experts of the same shapes (the dense-weight GEMM: what
widening buys once the tensor cores bound the call); then a few tiles of the current kernel at a decode and a prefill
token count. JSON
lines on stdout, all of it in $OUT/mxfp4_ab.json.

The previous kernel may read the experts' nibbles paired by halves (byte j of a group: weights j and 16 + j, as
096de46's loader laid them out): PAIRED=1 gives it its bytes so.

    mkdir -p .baseline/moe_old && git show 096de46:railyard/engine/runner/kernels/fused_moe.py \
        > .baseline/moe_old/fused_moe_old.py          # carry .baseline/moe_old
    PAIRED=1 TOKENS=1,64,256,1024,16384 python3 scripts/dev/mxfp4_gemm_ab.py
"""
import functools, json, os, sys
ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, ".baseline/moe_old"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import moe_sweep
from triton.testing import do_bench_cudagraph
import fused_moe_old
from railyard.engine.runner.kernels import fused_moe
from railyard.engine.runner.layers.activation import clamped_swiglu

E, H, I, K = 32, 2880, 2880, 4
act = functools.partial(clamped_swiglu, alpha=1.702, limit=7.0)


def paired(blocks: torch.Tensor) -> torch.Tensor:
    """Checkpoint bytes -> each 16-byte group's nibbles paired by halves (byte j: weights j and 16 + j)."""
    b = blocks.reshape(*blocks.shape[:-1], blocks.shape[-1] // 16, 16)
    first, second = b[..., :8], b[..., 8:]
    return torch.stack(((first & 0x0F) | ((second & 0x0F) << 4), (first >> 4) | (second & 0xF0)),
                       dim=-1).reshape(blocks.shape)


torch.manual_seed(0)
dev = "cuda"
q13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, device=dev)
q2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, device=dev)
s13 = torch.randint(118, 124, (E, 2 * I, H // 32), dtype=torch.uint8, device=dev)
s2 = torch.randint(118, 124, (E, H, I // 32), dtype=torch.uint8, device=dev)
b13 = torch.randn(E, 2 * I, device=dev, dtype=torch.bfloat16) * 0.1
b2 = torch.randn(E, H, device=dev, dtype=torch.bfloat16) * 0.1
o13, o2 = (paired(q13), paired(q2)) if os.environ.get("PAIRED") == "1" else (q13, q2)
w13, w2, *_ = moe_sweep.experts("bf16", E, H, I)  # bf16 experts of the same shapes

def timed(fn, rep_ms=20):
    """Device microseconds per call replayed in a CUDA graph for about rep_ms, as the engine's steps run it (timed
    eagerly, a call's Python launches would hide the kernels at decode sizes)."""
    fn()
    return do_bench_cudagraph(fn, rep=rep_ms) * 1e3

rows = []
for T in [int(t) for t in os.environ.get("TOKENS", "1,16,64,256,1024,4096,16384").split(",")]:
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    top, ids = torch.topk(torch.randn(T, E, device=dev), K, dim=-1)
    w = torch.softmax(top, dim=-1).to(torch.bfloat16)
    old = lambda: fused_moe_old.fused_experts(x, o13, o2, w, ids, act, b13, b2, s13, s2)
    new = lambda: fused_moe.fused_experts(x, q13, q2, w, ids, act, b13, b2, s13, s2)
    a, b = old().float(), new().float()
    rel = ((a - b).norm() / a.norm()).item()
    t_old, t_new = timed(old), timed(new)
    t_old2, t_new2 = timed(old), timed(new)
    t_bf16 = timed(lambda: fused_moe.fused_experts(x, w13, w2, w, ids, act, b13, b2))
    row = {"tokens": T, "old_us": round(t_old, 1), "old_again_us": round(t_old2, 1), "new_us": round(t_new, 1),
           "new_again_us": round(t_new2, 1), "speedup": round(min(t_old, t_old2) / min(t_new, t_new2), 2),
           "bf16_weights_us": round(t_bf16, 1),
           "rel_diff": round(rel, 5), "tile": fused_moe.pick_config(T * K, E, False, True)}
    rows.append(row); print(json.dumps(row), flush=True)

# tiles for the current kernel at decode and prefill token counts
sweep = []
for T in [int(t) for t in os.environ.get("SWEEP_TOKENS", "64,256,16384").split(",")]:
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    top, ids = torch.topk(torch.randn(T, E, device=dev), K, dim=-1)
    w = torch.softmax(top, dim=-1).to(torch.bfloat16)
    for cfg in [(16, 64, 128, 4, 3), (16, 128, 128, 4, 3), (32, 64, 128, 4, 3), (32, 128, 128, 4, 3),
                (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3),
                (128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3)]:
        try:
            t = timed(lambda: fused_moe.fused_experts(x, q13, q2, w, ids, act, b13, b2, s13, s2, config=cfg), rep_ms=10)
        except Exception as exc:  # noqa: BLE001 -- a tile out of resources
            t = repr(exc)[:80]
        sweep.append({"tokens": T, "config": cfg, "us": t if isinstance(t, str) else round(t, 1)})
        print(json.dumps(sweep[-1]), flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "mxfp4_ab.json"), "w") as f:
    json.dump({"ab": rows, "sweep": sweep}, f, indent=1)
