"""`railyard bench ...` sub-commands."""

from __future__ import annotations

import argparse
import json
import sys

from railyard.bench.burst_cli import register_burst
from railyard.bench.serve_cli import register_serve
from railyard.bench.startup_cli import register_startup
from railyard.engine.args import add_engine_args, engine_config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print JSON")
    kinds = bench.add_subparsers(dest="bench_command", required=True)

    tp = kinds.add_parser("throughput", help="offline throughput of one engine on a synthetic workload")
    tp.add_argument("--num-prompts", type=int, default=64, help="requests in the workload, all submitted at once")
    tp.add_argument("--input-len", default="32-128", help="N or LOW-HIGH prompt tokens (seeded uniform)")
    tp.add_argument("--output-len", default="32", help="N or LOW-HIGH output tokens (EOS ignored)")
    tp.add_argument("--workload-seed", type=int, default=0, help="seed of the prompts' lengths and tokens")
    tp.add_argument("--warmup-prompts", type=int, default=8,
                    help="untimed prompts of the same lengths (4 output tokens) run first, so JIT compilation "
                         "is not measured; 0: none")
    tp.add_argument("--runs", type=int, default=1,
                    help="run the workload this many times in the one engine, each run its own prompts (the same "
                         "lengths, other token ids: no prefix hits between runs); the JSON's `runs` lists each, and "
                         "first_over_last compares the first run's output tok/s with the last's (a first run slowed by "
                         "first-use work shows below 1). Give --warmup-prompts 0 to measure the first run as a "
                         "server's first requests meet the engine")
    tp.add_argument("--token-id-range", type=int, default=None,
                    help="draw prompt token ids below this, as `railyard bench serve` does, so both run the very same "
                         "requests (default: the model's vocabulary)")
    tp.add_argument("--peak-tflops", type=float, default=None,
                    help="matmul peak for the roofline, TFLOP/s (default: the device's as measured here: 790 bf16 "
                         "on an H200, 798 on an H100 80GB HBM3; on another device no roofline "
                         "unless given with --hbm-tbs)")
    tp.add_argument("--fp8-peak-tflops", type=float, default=None,
                    help="FP8 matmul peak for the roofline of FP8 weights (default: 2x the bf16 peak)")
    tp.add_argument("--hbm-tbs", type=float, default=None,
                    help="memory bandwidth for the roofline, TB/s (default: the device's as measured here: 4.3 on "
                         "an H200, 3.0 on an H100 80GB HBM3; on another device no roofline "
                         "unless given with --peak-tflops)")
    tp.add_argument("--num-loras", type=int, default=0,
                    help="serve this many random LoRA adapters (PEFT format, written for the model's shape) with the "
                         "requests spread evenly over them, after the same workload on the base model alone (0: no "
                         "adapters); the report holds both runs and their ratio")
    tp.add_argument("--lora-rank", type=int, default=16, help="the random adapters' rank")
    tp.add_argument("--lora-baseline", action=argparse.BooleanOptionalAction, default=True,
                    help="with --num-loras, first run the workload on an engine without LoRA (the base model)")
    add_engine_args(tp)
    tp.set_defaults(func=run_throughput_cmd)

    register_serve(kinds)
    register_burst(kinds)
    register_startup(kinds)


def run_throughput_cmd(args: argparse.Namespace) -> int:
    from railyard.bench.throughput import run_throughput
    from railyard.engine.engine import Engine
    from railyard.engine.startup.gc_heap import frozen_heap
    from railyard.bench.workload import LengthRange, reuse_warning
    from railyard.errors import ConfigError

    if args.num_prompts < 1:
        raise ConfigError("--num-prompts must be at least 1")
    if args.runs < 1:
        raise ConfigError("--runs must be at least 1")
    input_len, output_len = LengthRange.parse(args.input_len), LengthRange.parse(args.output_len)
    if args.warmup_prompts < 0:
        raise ConfigError("--warmup-prompts must be >= 0")
    if args.num_loras:
        return run_lora_throughput_cmd(args, input_len, output_len)
    engine = Engine.from_config(engine_config_from_args(args))
    if args.token_id_range is not None and not 1 <= args.token_id_range <= engine.spec.vocab_size:
        raise ConfigError(f"--token-id-range must be in [1, {engine.spec.vocab_size}] (the vocabulary)")
    jit_before = engine.stats().jit_after_ready_total
    with frozen_heap():  # the runs see the collector as an engine's own process has it
        results = [run_throughput(engine, args.num_prompts, input_len, output_len, args.workload_seed,
                                  args.warmup_prompts if k == 0 else 0, args.token_id_range,
                                  progress=sys.stderr.isatty(), repeat=k) for k in range(args.runs)]
    result = results[0]
    report = result.to_dict()
    # What the figures were measured on: `railyard plan --profile` refuses them for another model or device.
    report["device"] = device_name(engine)
    report["model"] = {"name": engine.config.model, **profile_dimensions(engine.spec)}
    # The synthetic workload shares no prefixes: a high hit rate means repeated prompts, not a faster engine.
    report["warnings"] = [w for w in [reuse_warning(result.prefix_cache_hit_rate, shared_prefixes=False)] if w]
    for warning in report["warnings"]:
        print(f"railyard bench throughput: warning: {warning}", file=sys.stderr)
    if args.runs > 1:
        report["runs"] = [r.to_dict() for r in results]
        report["first_over_last"] = round(result.output_tokens_per_s / results[-1].output_tokens_per_s, 4)
        report["longest_token_gap_ms"] = [r.longest_token_gap_ms for r in results]  # per run: a stall in the first?
        # Triton kernels JIT'd during the runs (first-use work the start-up warm-up missed)
        report["jit_after_ready"] = engine.stats().jit_after_ready_total - jit_before
    memory = getattr(getattr(engine.executor, "runner", None), "memory", None)
    if memory is not None:  # the engine's start-up report: how its memory divided into weights and KV blocks
        report["memory"] = memory.as_dict()
    report["startup"] = engine.core.startup.as_dict()  # the engine's start-up report (in-process: no server phases)
    report.update(roofline_report(engine, args, input_len, output_len, result.elapsed_s))
    print(json.dumps(report, indent=1))
    return 0


def profile_dimensions(spec) -> dict[str, int | str]:
    """The dimensions that tell one model from another (railyard.model.spec.ModelSpec's)."""
    return {k: getattr(spec, k) for k in PROFILE_DIMENSIONS}


PROFILE_DIMENSIONS = ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                      "num_kv_heads")


def run_lora_throughput_cmd(args: argparse.Namespace, input_len, output_len) -> int:
    """--num-loras: the workload on the base model, then spread over that many random adapters (bench/lora.py)."""
    from railyard.bench.lora import run_lora_throughput
    from railyard.bench.throughput import run_throughput
    from railyard.engine.config import MAX_LORA_RANK
    from railyard.errors import ConfigError

    if args.num_loras < 0:
        raise ConfigError("--num-loras must be >= 0")
    if not 1 <= args.lora_rank <= MAX_LORA_RANK:
        raise ConfigError(f"--lora-rank must be in [1, {MAX_LORA_RANK}]")

    def run(engine, loras) -> dict:
        if args.token_id_range is not None and not 1 <= args.token_id_range <= engine.spec.vocab_size:
            raise ConfigError(f"--token-id-range must be in [1, {engine.spec.vocab_size}] (the vocabulary)")
        result = run_throughput(engine, args.num_prompts, input_len, output_len, args.workload_seed,
                                args.warmup_prompts, args.token_id_range, progress=sys.stderr.isatty(), loras=loras)
        return {**result.to_dict(), "device": device_name(engine)}

    report = run_lora_throughput(engine_config_from_args(args), run, args.num_loras, args.lora_rank,
                                 baseline=args.lora_baseline)
    print(json.dumps(report, indent=1))
    return 0


def device_name(engine) -> str:
    """What the engine runs on, as the driver names it (torch.cuda), or 'cpu'."""
    runner = getattr(engine.executor, "runner", None)
    device = getattr(runner, "device", None)
    if device is None or device.type != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(device)


def roofline_report(engine, args: argparse.Namespace, input_len, output_len, elapsed_s: float) -> dict:
    """The roofline's floor (docs/architecture.md, performance model) for this workload and model, and how close
    the measured run came (a line on stderr); on a device whose ceilings are not known, and none given, no floor."""
    from railyard.bench.roofline import device_peaks, offline_roofline
    from railyard.bench.throughput import workload_requests

    device = device_name(engine)
    peaks = device_peaks(device, args.peak_tflops, args.hbm_tbs)
    if peaks is None:
        note = (f"no roofline: the peak FLOP/s and memory bandwidth of {device} are not known here; pass "
                "--peak-tflops and --hbm-tbs for one")
        print(f"roofline: {note}", file=sys.stderr)
        return {"roofline": None, "measured_over_roofline": None, "percent_of_roofline": None, "roofline_note": note}
    peak, bw = peaks
    reqs = workload_requests(engine, args.num_prompts, input_len, output_len, args.workload_seed, args.token_id_range)
    fp8_peak = args.fp8_peak_tflops or 2 * peak
    roof = offline_roofline(roofline_spec(engine), [len(r.prompt_token_ids) for r in reqs],
                            [r.output_len for r in reqs], peak, bw, fp8_peak)
    pct = 100.0 * roof.total_s / elapsed_s
    fp8 = roof.fp8_peak_tflops is not None
    rates = f"{peak:g} TFLOP/s" + (f" ({fp8_peak:g} for the FP8 linear layers)" if fp8 else "")
    print(f"roofline: floor {roof.total_s:.2f} s (prefill {roof.prefill_s:.2f} s + decode {roof.decode_s:.2f} s at "
          f"{rates}, {bw:g} TB/s); measured {elapsed_s:.2f} s = {elapsed_s / roof.total_s:.2f}x the floor "
          f"({pct:.1f}% of roofline)", file=sys.stderr)
    return {"roofline": roof.to_dict(), "measured_over_roofline": round(elapsed_s / roof.total_s, 3),
            "percent_of_roofline": round(pct, 1)}


def roofline_spec(engine):
    """The model as the engine runs it, which the roofline counts: model dtype, FP8 linear weights, KV-cache dtype.
    The runner's own description; for tensor-parallel workers in other processes, the same one from the config."""
    runner = getattr(engine.executor, "runner", None)
    if runner is not None:
        return runner.spec
    c = engine.config
    return engine.spec.with_precision(c.dtype, c.kv_cache_dtype, c.quantization)  # TP ranks run on GPUs
