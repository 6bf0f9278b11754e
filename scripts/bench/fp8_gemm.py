"""Which FP8 GEMM for which batch (the `fp8_gemm` engine option), one step per invocation so a budgeted script can
time each (scripts/bench/fp8.sh runs `benches` and `summary`; `sweep` and `profile` are tuning tools):

  sweep            the qwen2-7b linear layers (qkv, o, gate_up, down) at 16 ... 16,384 rows: bf16, torch's row-wise
                   CUTLASS _scaled_mm (with and without fast accumulation), the unscaled cuBLASLt _scaled_mm with
                   and without the scales pass, vLLM's per-tensor _scaled_mm (bf16 out), the Triton GEMM
                   (autotuned, precise and fast accumulation, and each of its tiles), the per-token
                   quantization, and fp8_linear whole ("auto" and "rowwise"): microseconds and TFLOP/s, timed as
                   CUDA graphs of back-to-back calls over weight copies that overflow the L2 cache (a decode step
                   never finds a layer's weights there) -> $OUT/gemm_sweep.json
  profile VARIANT [decode|prefill]
                   one decode step of 256 rows, or one prefill step of 16 x 1,024 tokens (eager, so each kernel
                   shows) of the qwen2-7b shape under torch.profiler: bf16, fp8-rowwise(-fast), fp8-cublaslt or
                   fp8-auto; top kernels by GPU time -> appended to $OUT/profile.txt
  benches DIR      the `bench throughput` JSONs fp8.sh left in DIR -> $OUT/benches.json
  summary          the run in a few lines (fp8.sh appends them to $OUT/log.txt)

DRY_RUN=1: the same steps on the CPU with small shapes and the embedded tiny model (the named tensor-core
GEMMs and the Triton kernels do not run there: those variants record their error (the kernel tests run the
Triton GEMM in the interpreter); the profile runs bf16 and fp8-auto).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

ROOT = __file__.rsplit("/scripts/", 1)[0]
sys.path.insert(0, ROOT)
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
os.makedirs(OUT, exist_ok=True)
DRY = os.environ.get("DRY_RUN") == "1"
DEV = torch.device("cpu" if DRY else "cuda")
# qwen2-7b: hidden 3584, 28 heads of 128 with 4 KV heads (qkv 3584 + 2 x 512), intermediate 18944. (K, N).
SHAPES = {"qkv": (64, 96), "o": (64, 64), "gate_up": (64, 256), "down": (128, 64)} if DRY else \
    {"qkv": (3584, 4608), "o": (3584, 3584), "gate_up": (3584, 37888), "down": (18944, 3584)}
ROWS = [16, 64, 256] if DRY else [16, 64, 128, 256, 512, 2048, 16384]
L2_OVERFLOW_BYTES = 256 << 20  # the H200's L2 is 50 MB: cycle through weight copies at least this large


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def _copies(nbytes: int) -> int:
    return max(1, min(8, math.ceil(L2_OVERFLOW_BYTES / nbytes)))


def time_calls(fn, count: int, reps: int) -> tuple[float, str]:
    """Seconds per call of fn(i) for i cycling over `count` weight copies: replayed from one CUDA graph of `reps`
    calls (no launch gaps, as the engine's graphs run them); eager with events if capture fails; wall clock on
    the CPU."""
    for i in range(min(count, 2)):
        fn(i)
    _sync()
    if DEV.type == "cpu":
        t = time.perf_counter()
        for i in range(reps):
            fn(i % count)
        return (time.perf_counter() - t) / reps, "cpu wall"
    how = "cuda graph"
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(min(count, 2)):  # warm-up on the capture stream, as torch's docs do
                fn(i)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            for i in range(reps):
                fn(i % count)
        run = graph.replay
    except Exception as exc:  # noqa: BLE001 - time it eagerly instead, and say so
        how = f"eager ({type(exc).__name__}: {str(exc)[:80]})"

        def run():
            for i in range(reps):
                fn(i % count)
    run()
    _sync()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        run()
    end.record()
    _sync()
    return start.elapsed_time(end) / 1e3 / (3 * reps), how


def kernel_names(fn) -> list[str]:
    """The GPU kernels one call of fn launches, by name (which library ran it: CUTLASS's cutlass::device_kernel,
    cuBLAS's sm90_xmma / nvjet kernels, Triton's own names), under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    if DEV.type != "cuda":
        return []
    fn(0)
    _sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(0)
        _sync()
    return [e.name[:160] for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]


def cublaslt_version() -> int | None:
    """The cuBLASLt the process loaded: torch sends row-wise scales to it (outer-vector scaling) instead of its
    own CUTLASS kernel on sm_90 when this and the build's cuBLAS are 12.9+ (ScaledBlas.cpp, _scaled_rowwise_rowwise)."""
    import ctypes

    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return int(ctypes.CDLL(name).cublasLtGetVersion())
        except (OSError, AttributeError):
            continue
    return None


def sweep() -> None:
    from railyard.engine.runner.kernels.fp8_gemm import CONFIGS, fp8_gemm
    from railyard.engine.runner.layers.fp8 import (apply_scales, fp8_linear, quantize_per_token, quantize_rows, scaled_mm,
                                            sm_count, tensor_core_gemm, unscaled_mm)

    one = torch.ones((), dtype=torch.float32, device=DEV)
    rows_out, start = [], time.time()
    for name, (k, n) in SHAPES.items():
        g = torch.Generator(device=DEV).manual_seed(k * n)
        w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=g) * 0.02
        ws = [w] + [w.clone() for _ in range(_copies(w.numel() * 2) - 1)]
        q, scale = quantize_rows(w)
        qs = [q] + [q.clone() for _ in range(_copies(q.numel()) - 1)]
        w_scalar = scale.max()  # vLLM's per-tensor weight scale (GEMM speed only: these numbers are not used)
        del w
        for m in ROWS:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=g)
            xq, xs = quantize_per_token(x)
            x_scalar = xs.max()

            def fast_unscaled(i):
                acc = torch._scaled_mm(xq, qs[i].t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                       use_fast_accum=True)
                return apply_scales(acc, xs, scale, None, torch.bfloat16)

            variants = {
                "bf16": (lambda i: F.linear(x, ws[i]), len(ws)),
                "fp8_rowwise": (lambda i: scaled_mm(xq, xs, qs[i], scale, None, torch.bfloat16), len(qs)),
                "fp8_rowwise_fast_accum": (lambda i: torch._scaled_mm(
                    xq, qs[i].t(), scale_a=xs, scale_b=scale.view(1, -1), out_dtype=torch.bfloat16,
                    use_fast_accum=True), len(qs)),
                "fp8_cublaslt": (lambda i: unscaled_mm(xq, xs, qs[i], scale, None, torch.bfloat16), len(qs)),
                "fp8_cublaslt_bf16_acc": (lambda i: unscaled_mm(xq, xs, qs[i], scale, None, torch.bfloat16,
                                                                torch.bfloat16), len(qs)),
                "fp8_cublaslt_gemm_only": (lambda i: torch._scaled_mm(
                    xq, qs[i].t(), scale_a=one, scale_b=one, out_dtype=torch.float32), len(qs)),
                "fp8_cublaslt_fast_accum": (fast_unscaled, len(qs)),
                "fp8_per_tensor_bf16_out": (lambda i: torch._scaled_mm(
                    xq, qs[i].t(), scale_a=x_scalar, scale_b=w_scalar, out_dtype=torch.bfloat16), len(qs)),
                "fp8_triton": (lambda i: fp8_gemm(xq, xs, qs[i], scale, None, torch.bfloat16), len(qs)),
                "fp8_triton_fast_accum": (lambda i: fp8_gemm(xq, xs, qs[i], scale, None, torch.bfloat16,
                                                             precise=False), len(qs)),
                "quant_per_token": (lambda i: quantize_per_token(x), 1),
                "fp8_linear_auto": (lambda i: fp8_linear(x, qs[i], scale, None, "auto"), len(qs)),
                "fp8_linear_rowwise": (lambda i: fp8_linear(x, qs[i], scale, None, "rowwise"), len(qs)),
            }
            flops = 2.0 * m * n * k
            reps = 4 if DRY else max(4, min(40, int(0.01 / (flops / 700e12))))  # ~10 ms of bf16 per variant
            row = {"shape": name, "m": m, "k": k, "n": n, "reps": reps, "auto_takes":
                   tensor_core_gemm("auto", m, n, sm_count(DEV.index or 0)) if DEV.type == "cuda" else "reference"}
            if m in (256, max(ROWS)) and name in ("qkv", "gate_up"):  # which library each path ran
                row["kernels"] = {}
                for variant in ("bf16", "fp8_rowwise", "fp8_rowwise_fast_accum", "fp8_cublaslt",
                                "fp8_per_tensor_bf16_out"):
                    try:
                        row["kernels"][variant] = kernel_names(variants[variant][0])
                    except Exception as exc:  # noqa: BLE001
                        row["kernels"][variant] = [f"{type(exc).__name__}: {str(exc)[:120]}"]
            for variant, (fn, count) in variants.items():
                try:
                    seconds, how = time_calls(fn, count, reps)
                    row[variant] = {"us": round(seconds * 1e6, 2), "tflops": round(flops / seconds / 1e12, 1)}
                    if how != "cuda graph":
                        row[variant]["timed"] = how
                except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others
                    row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            row["triton_configs_us"] = {}  # each fixed tile of the autotuned kernel (precise accumulation)
            for cfg in CONFIGS:
                label = "x".join(map(str, cfg[:3])) + f"/w{cfg[3]}/s{cfg[4]}"
                try:
                    seconds, _ = time_calls(lambda i, cfg=cfg: fp8_gemm(xq, xs, qs[i], scale, None, torch.bfloat16,
                                                                        config=cfg), len(qs), reps)
                    row["triton_configs_us"][label] = round(seconds * 1e6, 2)
                except Exception as exc:  # noqa: BLE001
                    row["triton_configs_us"][label] = f"{type(exc).__name__}: {str(exc)[:100]}"
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            save_sweep(rows_out, time.time() - start, quiet=True)  # a timeout later keeps what is measured
    save_sweep(rows_out, time.time() - start)


def _us(row: dict, variant: str) -> float:
    return row.get(variant, {}).get("us", math.inf)


def save_sweep(rows: list[dict], seconds: float, quiet: bool = False) -> None:
    """The rows, and per shape the rows where cuBLASLt (scales pass included) beats the row-wise kernel and the
    FP8/bf16 time ratio of each path (the numbers auto's shape rule, layers/fp8.py tensor_core_gemm, is chosen from)."""
    summary = {}
    for name in SHAPES:
        mine = [r for r in rows if r["shape"] == name]
        if not mine:
            continue
        summary[name] = {
            "cublaslt_faster_at_m": [r["m"] for r in mine if _us(r, "fp8_cublaslt") < _us(r, "fp8_rowwise")],
            "triton_faster_than_both_at_m": [r["m"] for r in mine if _us(r, "fp8_triton") < min(
                _us(r, "fp8_rowwise"), _us(r, "fp8_cublaslt"))],
            "speedup_over_bf16": {r["m"]: {v: round(_us(r, "bf16") / _us(r, v), 2) for v in (
                "fp8_rowwise", "fp8_rowwise_fast_accum", "fp8_cublaslt", "fp8_cublaslt_bf16_acc",
                "fp8_cublaslt_fast_accum",
                "fp8_per_tensor_bf16_out", "fp8_triton", "fp8_triton_fast_accum", "fp8_linear_auto",
                "fp8_linear_rowwise")} for r in mine},
        }
    big = [r for r in rows if r["m"] == max(ROWS)]
    bf16_best = max((r.get("bf16", {}).get("tflops", 0.0) for r in big), default=0.0)
    fp8_best = max((r.get("fp8_rowwise", {}).get("tflops", 0.0) for r in big), default=0.0)
    result = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu", "torch": torch.__version__,
              "cuda": torch.version.cuda, "cublaslt_runtime": cublaslt_version() if DEV.type == "cuda" else None,
              "dry_run": DRY, "seconds": round(seconds, 1), "summary": summary, "rows": rows,
              "bf16_best_tflops": bf16_best, "fp8_best_tflops": fp8_best,
              # as fp8_check.py gemm: the roofline's bf16 ceiling (790) scaled by the FP8/bf16 ratio measured here
              "fp8_peak_for_roofline": round(790.0 * fp8_best / bf16_best, 1) if bf16_best and fp8_best else None}
    with open(os.path.join(OUT, "gemm_sweep.json"), "w") as f:
        json.dump(result, f, indent=1)
    if quiet:
        return
    for name, s in summary.items():
        print(f"{name}: cuBLASLt with its scales pass faster than row-wise at M = {s['cublaslt_faster_at_m']}; "
              f"Triton faster than both at M = {s['triton_faster_than_both_at_m']}", flush=True)


def profile(variant: str, kind: str = "decode") -> None:
    """One step, eager and synchronous, under torch.profiler: kind "decode", a pure-decode step of 256 sequences;
    "prefill", a pure-prefill step of 16 new prompts of 1,024 tokens (the 16,384-token budget, where the offline
    workload spends most of its time)."""
    if kind not in ("decode", "prefill"):
        raise SystemExit(f"profile: kind must be decode or prefill, not {kind!r}")
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from railyard.engine.config import EngineConfig, SamplingParams
    from railyard.engine.engine import Engine
    from railyard.engine.startup.tiny_model import ensure_tiny_model

    quant = {"bf16": {}, "fp8-rowwise": dict(quantization="fp8", fp8_gemm="rowwise"),
             "fp8-rowwise-fast": dict(quantization="fp8", fp8_gemm="rowwise-fast"),
             "fp8-cublaslt": dict(quantization="fp8", fp8_gemm="cublaslt"),
             "fp8-cublaslt-fast": dict(quantization="fp8", fp8_gemm="cublaslt-fast"),
             "fp8-auto": dict(quantization="fp8", fp8_gemm="auto")}[variant]
    where = dict(model=str(ensure_tiny_model()), device="cpu") if DRY else dict(model="qwen2-7b", dtype="bfloat16")
    eng = Engine.from_config(EngineConfig(**where, **quant, enforce_eager=True, async_scheduling=False,
                                          num_gpu_blocks=4096, max_model_len=1024 if DRY else 2048, max_num_seqs=256,
                                          max_num_batched_tokens=16384, enable_prefix_caching=False))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    if kind == "decode":
        for i in range(256):
            eng.add_request(f"p{i}", None, params, prompt_token_ids=[(7 * i + j) % 200 + 10 for j in range(32)])
        for _ in range(3):  # the prefill of all 256 prompts, then two decode steps (kernels compiled, caches warm)
            eng.step()
    else:  # one prefill step of 16 x 1,024 to compile and warm, its requests dropped, then 16 new prompts
        prompt_len = 64 if DRY else 1024
        for i in range(16):
            eng.add_request(f"w{i}", None, params, prompt_token_ids=[(5 * i + j) % 200 + 10 for j in range(prompt_len)])
        eng.step()
        for i in range(16):
            eng.abort(f"w{i}")
        for i in range(16):
            eng.add_request(f"p{i}", None, params, prompt_token_ids=[(7 * i + j) % 200 + 10 for j in range(prompt_len)])
    _sync()
    cuda = DEV.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        t = time.perf_counter()
        eng.step()
        _sync()
        wall = time.perf_counter() - t
    averages = prof.key_averages()
    try:
        table = averages.table(sort_by="device_time_total" if cuda else "cpu_time_total", row_limit=20,
                               max_name_column_width=70)
    except Exception:  # noqa: BLE001 - older spelling of the same column
        table = averages.table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=20,
                               max_name_column_width=70)
    kernels = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]  # kernels, memcpys
    total_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                   for e in kernels)
    with open(os.path.join(OUT, "profile.txt"), "a") as f:
        what = "one decode step of 256 sequences" if kind == "decode" else "one prefill step of 16 prompts"
        f.write(f"\n## {variant}: {what} ({'qwen2-7b' if not DRY else 'tiny, CPU'}), eager: "
                f"wall {wall * 1e3:.2f} ms, GPU kernel time {total_us / 1e3:.2f} ms\n{table}\n")
    print(f"{variant} {kind}: wall {wall * 1e3:.2f} ms, kernels {total_us / 1e3:.2f} ms", flush=True)
    eng.shutdown()


# The order benches.json lists them in; a variant whose bench never started (its step skipped) is left out, one
# that failed keeps its place with the error. (Listing variants the script does not run made the first H200 run
# report fp8-auto and fp8-auto-kv as FileNotFoundError: fp8-gemm.sh benches fp8-rowwise, auto's choice, instead.)
BENCH_VARIANTS = ("bf16", "bf16-again", "fp8-rowwise", "fp8-rowwise-fast", "fp8-rowwise-kv", "fp8-rowwise-kv-bf16-tiles",
                  "fp8-rowwise-fast-kv", "fp8-rowwise-fast-kv-bf16-tiles", "fp8-cublaslt", "fp8-cublaslt-kv",
                  "fp8-auto", "fp8-auto-kv", "fp8-auto-again", "fp8-auto-kv-again", "fp8-triton", "0.6b-bf16",
                  "0.6b-fp8-auto", "0.6b-fp8-auto-kv")


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as exc:  # noqa: BLE001 - a step that failed or never ran: say so in its place
        return {"missing": repr(exc)[:160]}


def benches(bench_dir: str) -> None:
    """The `bench throughput` outputs in bench_dir (one JSON each, named for its variant) -> $OUT/benches.json:
    every variant that ran, in BENCH_VARIANTS order, then any other."""
    ran = [f.removesuffix(".json") for f in os.listdir(bench_dir) if f.endswith(".json")]
    order = sorted(ran, key=lambda v: (BENCH_VARIANTS.index(v) if v in BENCH_VARIANTS else len(BENCH_VARIANTS), v))
    runs = {name: _load(os.path.join(bench_dir, name + ".json")) for name in order}
    with open(os.path.join(OUT, "benches.json"), "w") as f:
        json.dump(runs, f, indent=1)


def summary() -> None:
    """The run in a few lines: throughput side by side, where each GEMM wins, which kernels ran, the profiles."""
    runs = _load(os.path.join(OUT, "benches.json"))
    if "missing" in runs:
        print("benches.json:", runs["missing"])
        runs = {}
    bases = {}  # variant prefix ("" for the 7B, "0.6b-" for the small shape) -> its bf16 baseline
    for prefix in {"0.6b-" if name.startswith("0.6b-") else "" for name in runs}:
        base = runs.get(prefix + "bf16", {})
        bf16 = [r for name, r in runs.items() if name in (prefix + "bf16", prefix + "bf16-again")
                and "output_tokens_per_s" in r]
        if len(bf16) == 2:  # the baseline twice (fp8.sh): speed-ups over their mean, and their spread said
            base = dict(base, output_tokens_per_s=sum(r["output_tokens_per_s"] for r in bf16) / 2)
            print(f"{prefix}bf16 twice: {bf16[0]['elapsed_s']:.2f} and {bf16[1]['elapsed_s']:.2f} s; x bf16 is over "
                  "their mean")
        bases[prefix] = base
    print("variant       seconds  out tok/s  x bf16  KV blocks  x bf16  % roofline")
    for name, r in runs.items():
        if "elapsed_s" not in r:
            print(f"{name:12}  failed ({r.get('missing', '')})")
            continue
        base = bases["0.6b-" if name.startswith("0.6b-") else ""]
        speed = r["output_tokens_per_s"] / base["output_tokens_per_s"] if "output_tokens_per_s" in base else math.nan
        blocks = r["num_kv_blocks"] / base["num_kv_blocks"] if "num_kv_blocks" in base else math.nan
        print(f"{name:12} {r['elapsed_s']:8.2f} {r['output_tokens_per_s']:10.0f} {speed:7.2f} {r['num_kv_blocks']:10d} "
              f"{blocks:7.2f} {r.get('percent_of_roofline') or math.nan:10.1f}")
    sweep_out = _load(os.path.join(OUT, "gemm_sweep.json"))
    if "missing" not in sweep_out:  # fp8.sh runs no sweep and no profile
        print(f"torch {sweep_out.get('torch')} cuda {sweep_out.get('cuda')} cuBLASLt {sweep_out.get('cublaslt_runtime')}")
    for row in sweep_out.get("rows", []):
        for variant, names in row.get("kernels", {}).items():
            print(f"kernels {row['shape']} M={row['m']} {variant}: " + " | ".join(n[:90] for n in names))
    for shape, s in sweep_out.get("summary", {}).items():
        print(f"gemm {shape}: cuBLASLt (+ scales pass) faster than row-wise at M = {s['cublaslt_faster_at_m']}; "
              f"Triton faster than both at M = {s['triton_faster_than_both_at_m']}")
        for m, ratios in s["speedup_over_bf16"].items():
            print(f"   M={m:>5}: x bf16 " + ", ".join(f"{k.removeprefix('fp8_')} {v}" for k, v in ratios.items()))
    if os.path.exists(os.path.join(OUT, "profile.txt")):
        with open(os.path.join(OUT, "profile.txt")) as f:
            for line in f:
                if line.startswith("## "):
                    print("profile", line[3:].strip())


if __name__ == "__main__":
    {"sweep": sweep, "profile": lambda: profile(*sys.argv[2:4]), "benches": lambda: benches(sys.argv[2]),
     "summary": summary}[sys.argv[1]]()
