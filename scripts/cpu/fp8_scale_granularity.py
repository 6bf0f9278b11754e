"""What coarser FP8 scales would cost in accuracy: option (a) of the decode-size GEMM question (issue 15).

railyard quantizes activations per token and weights per output channel. vLLM's on-the-fly `--quantization fp8`
uses one dynamic scale per activation tensor and one per weight tensor, which lets one tensor-wise cuBLASLt
_scaled_mm (bf16 out, bias fused) do the whole layer with no scales pass after it. This measures, with the
accuracy harness of tests/bench/test_fp8_accuracy.py (the same tiny models, prompts and bf16 reference), the
three granularities:

  per-token x per-channel   what the engine runs (both its tensor-core GEMMs compute these numbers)
  per-tensor x per-channel  one activation scale per GEMM call (the whole step's batch), channel weight scales
  per-tensor x per-tensor   vLLM's on-the-fly scheme (one weight scale per checkpoint tensor: q, k, v, gate
                            and up each their own, as vLLM keeps them per shard)

by swapping the quantizers the layers call (the GEMMs are the reference path's: this is about numbers, not
speed). Caveat: random weights have no outlier features or tokens; trained models' activations do (a few
channels and the first token carry values 100x the rest), which is where a per-tensor activation scale loses
most: these figures are a lower bound on its cost.

    PYTHONPATH=. python scripts/cpu/fp8_scale_granularity.py        # ~10 s on 2 cores; prints JSON

It adds one synthetic GEMM with an outlier token (what random models lack) to show where per-tensor goes wrong.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.bench.accuracy import compare_prefill  # noqa: E402
from railyard.engine.runner.layers import fp8, linear  # noqa: E402
from railyard.engine.startup.tiny_model import write_tiny_checkpoint  # noqa: E402

_rng = random.Random(0)
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (40, 97, 128, 200)]  # tests/bench/test_fp8_accuracy.py's


def per_tensor_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole [M, K] activation (broadcast to [M, 1] so the GEMMs take it unchanged)."""
    xf = x.float()
    scale = fp8.scales_of(xf.abs().amax()).expand(x.shape[0], 1)
    return fp8.to_fp8(xf * scale.reciprocal()), scale


def per_tensor_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for a whole checkpoint tensor (expanded to its rows)."""
    wf = w.float()
    scale = fp8.scales_of(wf.abs().amax()).expand(w.shape[0]).contiguous()
    return fp8.to_fp8(wf * scale.reciprocal()[:, None]), scale


@contextmanager
def quantizers(activations=None, weights=None):
    """Swap the quantizers fp8_linear (activations) and the linear layers' loaders (weights) call."""
    saved = fp8.quantize_per_token, linear.quantize_rows
    try:
        if activations is not None:
            fp8.quantize_per_token = activations
        if weights is not None:
            linear.quantize_rows = weights
        yield
    finally:
        fp8.quantize_per_token, linear.quantize_rows = saved


SCHEMES = {
    "per-token x per-channel (engine)": {},
    "per-tensor x per-channel": dict(activations=per_tensor_activations),
    "per-tensor x per-tensor (vLLM on-the-fly)": dict(activations=per_tensor_activations, weights=per_tensor_weights),
}


def outlier_token_gemm(boost: float) -> dict:
    """A 7B-wide GEMM (256 tokens x 3584 -> 512 outputs, Gaussian data) with token 0 `boost` times larger than
    the rest, as the first token of trained LLMs often is ("massive activations"): the relative error of the
    OTHER tokens' outputs with per-token and with per-tensor activation scales (weights per channel in both)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3584, generator=g)
    x[0] *= boost
    w = torch.randn(512, 3584, generator=g) * 0.02
    q, ws = fp8.quantize_rows(w)
    want = x[1:] @ w.t()
    out = {}
    for name, quant in (("per-token", fp8.quantize_per_token_ref), ("per-tensor", per_tensor_activations)):
        xq, xs = quant(x)
        got = fp8.dequantized_linear(xq, xs, q, ws, None, torch.float32)[1:]
        out[name] = round(((got - want).norm() / want.norm()).item(), 4)
    return out


def main() -> None:
    start = time.time()
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("qwen2", "qwen3", "llama"):
            path = str(write_tiny_checkpoint(Path(tmp) / arch, arch))
            for scheme, swap in SCHEMES.items():
                with quantizers(**swap):
                    result = compare_prefill(path, PROMPTS, {}, {"fp8 weights": dict(quantization="fp8")},
                                             device="cpu", dtype="bfloat16")["fp8 weights"]
                out.setdefault(scheme, {})[arch] = {
                    "worst layer cosine": round(min(result.layer_cosine), 5),
                    "mean logit KL": round(result.logit_kl_mean, 5), "top-1": round(result.top1_agreement, 3)}
    summary = {scheme: {"worst layer cosine": min(r["worst layer cosine"] for r in per.values()),
                        "worst mean KL": max(r["mean logit KL"] for r in per.values())} for scheme, per in out.items()}
    print(json.dumps({"reference": "bf16 model, same weights; FP8 weights through the reference GEMMs",
                      "prompts": [len(p) for p in PROMPTS], "seconds": round(time.time() - start, 1),
                      "summary": summary, "by_arch": out,
                      "outlier token, relative GEMM error of the other tokens": {
                          f"token 0 x{boost:g}": outlier_token_gemm(boost) for boost in (1, 100, 1000, 3000, 10000)}},
                     indent=1))


if __name__ == "__main__":
    main()
