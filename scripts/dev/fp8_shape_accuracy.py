"""FP8 accuracy of a big named shape's first layers on the CPU: inherent to random weights, or a fault?

The qwen2-7b shape on the H200 (scripts/bench/fp8_check.py accuracy, 28 layers) kept a per-layer cosine of
only 0.834 by its last layer with FP8 weights. This runs the same comparison on the CPU's reference path
(dequantize then matmul: no Triton kernel, no _scaled_mm), the same random weights the engine draws for
the shape and the same four prompts, with the model cut to its first --layers layers, and adds what tells
the two causes apart:

  variants     FP8 weights, FP8 KV cache, both: against the bf16 model (railyard.bench.accuracy);
  control      the bf16 model against the float32 model of the same draw: a ~16x smaller, unrelated rounding,
               to see how any perturbation grows through these random layers;
  gemms        each GEMM of the first and last layer on the reference's own inputs: relative error of the
               FP8 product (both operands rounded), of weights alone, of activations alone, and the inputs'
               per-token amax / RMS (what per-token scaling has to cover);
  residual_rms the reference's residual stream per layer (do random layers blow activations up?).

    PYTHONPATH=. python scripts/dev/fp8_shape_accuracy.py --shape qwen2-7b --layers 4

Prints one JSON object. About 10 minutes and 10 GB for 4 layers of qwen2-7b on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.bench.accuracy import build_runner, compare, prefill  # noqa: E402
from railyard.bench.workload import LengthRange, synthetic_requests  # noqa: E402
from railyard.engine.runner.layers.fp8 import quantize_per_token_ref, quantize_rows  # noqa: E402
from railyard.shapes import shape_config  # noqa: E402

GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def gpu_run_prompts(vocab_size: int) -> list[list[int]]:
    """The prompts fp8_check.py's accuracy step fed the 7B shape on the H200 (4 prompts, 1151 tokens)."""
    return [r.prompt_token_ids for r in synthetic_requests(4, LengthRange(128, 512), LengthRange(1, 1),
                                                             vocab_size, 11, 100, 100)]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return round(((got - want).norm() / want.norm()).item(), 5)


def gemm_errors(runner, prompts: list[list[int]], layers: list[int], tokens: int) -> dict:
    """Each linear layer's FP8 error on the inputs the bf16 model gives it (the first `tokens` positions)."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = []
    for i in layers:
        block = runner.model.model.layers[i]
        for name, module in list(block.self_attn.named_children()) + list(block.mlp.named_children()):
            if name in GEMMS:
                hooks.append(module.register_forward_hook(
                    lambda m, args, out, key=f"layer {i} {name}": inputs.__setitem__(key, (m, args[0][:tokens]))))
    try:
        prefill(runner, prompts)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for key, (module, x) in inputs.items():
        w = module.weight
        q, ws = quantize_rows(w)
        xq, xs = quantize_per_token_ref(x)
        wf, xf = w.float(), x.float()
        w8, x8 = q.float() * ws[:, None], xq.float() * xs
        want = xf @ wf.t()
        rms = xf.pow(2).mean(-1).sqrt()
        out[key] = {"fp8": _rel(x8 @ w8.t(), want), "weights only": _rel(xf @ w8.t(), want),
                    "activations only": _rel(x8 @ wf.t(), want),
                    "input amax/rms median": round((xf.abs().amax(-1) / rms).median().item(), 2),
                    "input rms median": round(rms.median().item(), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gemm-tokens", type=int, default=256, help="positions the GEMM errors are measured on")
    args = ap.parse_args()
    prompts = gpu_run_prompts(shape_config(args.shape)["vocab_size"])
    common = dict(device="cpu", num_layers=args.layers, max_model_len=4096)
    start = time.time()
    result: dict = {"shape": args.shape, "layers": args.layers, "torch": torch.__version__,
                    "prompt_lens": [len(p) for p in prompts], "reference": "bf16 model, bf16 KV cache"}

    ref_runner = build_runner(args.shape, prompts, dtype="bfloat16", **common)
    result["gemms"] = gemm_errors(ref_runner, prompts, [0, args.layers - 1], args.gemm_tokens)
    reference = prefill(ref_runner, prompts)
    result["residual_rms"] = [round(h.pow(2).mean().sqrt().item(), 3) for h in reference.layers]
    del ref_runner
    variants = {"fp8 weights": dict(quantization="fp8"), "fp8 kv cache": dict(kv_cache_dtype="fp8"),
                "fp8 weights + kv cache": dict(quantization="fp8", kv_cache_dtype="fp8")}
    for name, extra in variants.items():
        runner = build_runner(args.shape, prompts, dtype="bfloat16", **common, **extra)
        result[name] = compare(reference, prefill(runner, prompts)).to_dict()
        del runner
    del reference

    f32 = prefill(build_runner(args.shape, prompts, dtype="float32", **common), prompts)
    bf16 = prefill(build_runner(args.shape, prompts, dtype="bfloat16", **common), prompts)
    result["control: bf16 against float32"] = compare(f32, bf16).to_dict()
    result["seconds"] = round(time.time() - start, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
