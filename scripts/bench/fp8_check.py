"""GPU measurements of FP8 weights and KV cache, one step per invocation so a budgeted script can time each
(scripts/bench/fp8.sh runs `accuracy`):

  gemm      bf16 matmul and row-wise FP8 torch._scaled_mm rates (TFLOP/s) on the 7B prefill shapes and
            8192^3, the per-token quantization kernel's bandwidth; the FP8 peak for the roofline.
  accuracy  qwen2-7b shape, random weights, bf16 reference vs FP8 weights / FP8 KV / both: per-layer
            cosine, logit KL, teacher-forced top-1 (railyard/bench/accuracy.py), Triton backend; FP8
            weights again through the dequantizing reference GEMMs, and bf16 against float32 (a control).
  gemm-accuracy  the accuracy step's measures for FP8 weights through each tensor-core GEMM (rowwise,
            rowwise-fast, cublaslt-fast, auto) only: what fast accumulation and auto's mix cost.
  tiny      the float32 tiny models on the GPU (Triton, CUDA graphs): greedy tokens with an FP8 KV cache
            against a bf16 one, and FP8 weights against none.
Each writes $OUT/fp8_<step>.json.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

import torch  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")


def save(step: str, result: dict) -> None:
    with open(os.path.join(OUT, f"fp8_{step}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1), flush=True)


def timed(fn, reps: int = 10) -> float:
    """Seconds per call, CUDA events, after warm-up."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def gemm() -> None:
    from railyard.engine.runner.layers.fp8 import quantize_per_token, quantize_rows, scaled_mm

    dev = torch.device("cuda")
    shapes = {"8192^3": (8192, 8192, 8192), "7B gate_up, 16k tokens": (16384, 3584, 37888),
              "7B down, 16k tokens": (16384, 18944, 3584), "7B qkv, 256 tokens (decode)": (256, 3584, 4608)}
    rows = []
    for name, (m, k, n) in shapes.items():
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        bf16_s = timed(lambda: x @ w.t())
        q, scale = quantize_rows(w)
        xq, xs = quantize_per_token(x)
        fp8_s = timed(lambda: scaled_mm(xq, xs, q, scale, None, torch.bfloat16))
        quant_s = timed(lambda: quantize_per_token(x))
        flops = 2.0 * m * n * k
        rows.append({"shape": name, "mnk": [m, k, n], "bf16_tflops": round(flops / bf16_s / 1e12, 1),
                     "fp8_rowwise_tflops": round(flops / fp8_s / 1e12, 1),
                     "per_token_quant_us": round(quant_s * 1e6, 1),
                     "per_token_quant_gbs": round(m * k * 3 / quant_s / 1e9, 1)})  # 2 bytes in, 1 out
        del x, w, q, xq
    bf16_best = max(r["bf16_tflops"] for r in rows)
    fp8_best = max(r["fp8_rowwise_tflops"] for r in rows)
    # The roofline's bf16 ceiling is the 790 TFLOP/s measured in this workplace before; its FP8 ceiling is
    # scaled by the FP8/bf16 ratio measured here, so both rooflines stand on the same footing.
    save("gemm", {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                  "bf16_best_tflops": bf16_best, "fp8_best_tflops": fp8_best,
                  "fp8_peak_for_roofline": round(790.0 * fp8_best / bf16_best, 1)})


def accuracy() -> None:
    from railyard.bench.accuracy import compare_prefill
    from railyard.bench.workload import LengthRange, synthetic_requests
    from railyard.engine.runner.layers import fp8

    reqs = synthetic_requests(4, LengthRange(128, 512), LengthRange(1, 1), 152064, 11, 100, 100)
    prompts = [r.prompt_token_ids for r in reqs]
    variants = {"fp8 weights": dict(quantization="fp8"), "fp8 kv cache": dict(kv_cache_dtype="fp8"),
                "fp8 weights + kv cache": dict(quantization="fp8", kv_cache_dtype="fp8")}
    common = dict(device="cuda", attention_backend="triton", max_model_len=4096)
    # $ACCURACY_PARTS: which comparisons (default all four; each rebuilds the 7B model per variant)
    parts = os.environ.get("ACCURACY_PARTS", "prefill reference decode control").split()
    start = time.time()
    results = {}
    if "prefill" in parts:
        results.update(compare_prefill("qwen2-7b", prompts, {}, variants, dtype="bfloat16", **common))
    # The same FP8 numbers through the dequantizing reference GEMMs (the CPU's path): the tensor cores' share.
    scaled_mm_supported = fp8.scaled_mm_supported
    fp8.scaled_mm_supported = lambda device, dtype: False
    try:
        if "reference" in parts:
            results.update(compare_prefill("qwen2-7b", prompts, {}, {"fp8 weights, reference GEMMs": dict(
                quantization="fp8")}, dtype="bfloat16", **common))
    finally:
        fp8.scaled_mm_supported = scaled_mm_supported
    if "decode" in parts:
        results.update(decode_accuracy(prompts, common))
    # How any rounding grows through 28 random layers: bf16 against float32, a perturbation ~16x smaller.
    if "control" in parts:
        results.update(compare_prefill("qwen2-7b", prompts, dict(dtype="float32"),
                                       {"control: bf16 against float32": dict(dtype="bfloat16")}, **common))
    save("accuracy", {"model": "qwen2-7b (random weights, std 0.02)", "reference": "bf16, bf16 KV",
                      "prompt_lens": [len(p) for p in prompts], "seconds": round(time.time() - start, 1),
                      **{name: r.to_dict() for name, r in results.items()}})


def decode_accuracy(prompts: list[list[int]], common: dict) -> dict:
    """Decode steps (teacher-forced, the prompts' last 32 positions): the decode kernel reads the FP8 cache, with
    FP8 dots (q and P in e4m3 on FP8 tensor cores: the default on Hopper) and with float16 dots."""
    from railyard.bench.accuracy import compare_prefill
    from railyard.engine.runner.kernels import paged_attention

    decode = {"decode: fp8 kv cache": dict(kv_cache_dtype="fp8"),
              "decode: fp8 weights + kv cache": dict(quantization="fp8", kv_cache_dtype="fp8")}
    results = compare_prefill("qwen2-7b", prompts, {}, decode, decode_tokens=32, dtype="bfloat16", **common)
    fp8_dots = paged_attention.fp8_dots
    paged_attention.fp8_dots = lambda q, kv_cache: False  # the float16-dots decode kernel, in this process only
    try:
        results.update(compare_prefill("qwen2-7b", prompts, {}, {
            "decode: fp8 kv cache, float16 dots": dict(kv_cache_dtype="fp8")}, decode_tokens=32, dtype="bfloat16",
            **common))
    finally:
        paged_attention.fp8_dots = fp8_dots
    return results


def gemm_accuracy() -> None:
    """FP8 weights through each tensor-core GEMM choice against bf16 on the qwen2-7b shape (the accuracy step's
    prompts and measures): fast accumulation's cost in accuracy, next to the default's. DRY_RUN=1: the embedded
    tiny model on the CPU, every choice through the reference path (named GEMMs need FP8 tensor cores)."""
    from railyard.bench.accuracy import compare_prefill
    from railyard.bench.workload import LengthRange, synthetic_requests

    dry = os.environ.get("DRY_RUN") == "1"
    if dry:
        from railyard.engine.startup.tiny_model import ensure_tiny_model

        model, common, gemms = str(ensure_tiny_model()), dict(device="cpu", max_model_len=512), {"auto": "auto"}
        prompts = [r.prompt_token_ids for r in synthetic_requests(2, LengthRange(16, 48), LengthRange(1, 1), 256,
                                                                  11, 100, 100)]
    else:
        model, common = "qwen2-7b", dict(device="cuda", attention_backend="triton", max_model_len=4096)
        gemms = {g: g for g in ("rowwise", "rowwise-fast", "cublaslt-fast", "auto")}
        prompts = [r.prompt_token_ids for r in synthetic_requests(4, LengthRange(128, 512), LengthRange(1, 1),
                                                                  152064, 11, 100, 100)]
    start = time.time()
    results = compare_prefill(model, prompts, {}, {f"fp8 weights, {name}": dict(quantization="fp8", fp8_gemm=g)
                                                   for name, g in gemms.items()}, dtype="bfloat16", **common)
    save("gemm_accuracy", {"model": model, "reference": "bf16", "prompt_lens": [len(p) for p in prompts],
                           "seconds": round(time.time() - start, 1),
                           **{name: r.to_dict() for name, r in results.items()}})


def tiny() -> None:
    from railyard.bench.accuracy import greedy_agreement
    from railyard.engine.config import SamplingParams
    from railyard.engine.llm import LLM
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint

    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (5, 17, 33, 64, 100, 9, 50, 128)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    out = {}
    for arch in ("qwen2", "qwen3", "llama"):
        path = str(write_tiny_checkpoint(f"/tmp/fp8-tiny-{arch}", arch))
        tokens = {}
        for name, kw in {"fp32 kv": {}, "bf16 kv": dict(kv_cache_dtype="bfloat16"),
                         "fp8 kv": dict(kv_cache_dtype="fp8"), "fp8 weights": dict(quantization="fp8")}.items():
            llm = LLM(path, device="cuda", dtype="float32", attention_backend="triton", max_model_len=512,
                      gpu_memory_utilization=0.2, **kw)
            tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts,
                                                                           sampling_params=params, use_tqdm=False)]
            del llm
            torch.cuda.empty_cache()
        out[arch] = {"fp8 kv vs bf16 kv": greedy_agreement(tokens["bf16 kv"], tokens["fp8 kv"]),
                     "bf16 kv vs fp32 kv": greedy_agreement(tokens["fp32 kv"], tokens["bf16 kv"]),
                     "fp8 weights vs none": greedy_agreement(tokens["fp32 kv"], tokens["fp8 weights"])}
    save("tiny", out)


if __name__ == "__main__":
    {"gemm": gemm, "accuracy": accuracy, "gemm-accuracy": gemm_accuracy, "tiny": tiny}[sys.argv[1]]()
