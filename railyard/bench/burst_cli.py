"""`railyard bench burst`: flags, run, JSON on stdout, table on stderr, optional timeline PNG."""

from __future__ import annotations

import argparse
import asyncio

from railyard.errors import ConfigError


def register_burst(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("burst", help="a step in Poisson traffic: per-second arrivals, queue, replicas, TTFT, "
                                       "failures")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (without /v1)")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--rate", type=float, default=2.0, help="steady Poisson arrival rate, requests/s")
    p.add_argument("--burst-factor", type=float, default=4.0, help="the burst's rate as a multiple of --rate")
    p.add_argument("--steady-s", type=float, default=30.0, help="seconds of steady load before the burst")
    p.add_argument("--burst-s", type=float, default=60.0, help="seconds the burst lasts")
    p.add_argument("--after-s", type=float, default=60.0, help="seconds of steady load after the burst")
    p.add_argument("--input-len", default="128", help="N or LOW-HIGH prompt tokens (seeded uniform)")
    p.add_argument("--output-len", default="128", help="N or LOW-HIGH output tokens (EOS ignored)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals and the prompts")
    p.add_argument("--app", default=None, help="Ray Serve application whose replicas to record (with --deployment)")
    p.add_argument("--deployment", default=None, help="its engine deployment, e.g. engine-tiny-default")
    p.add_argument("--ray-address", default="auto", help="the Ray cluster to read serve.status() from")
    p.add_argument("--sample-period", type=float, default=1.0, help="seconds between samples of the fleet")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default: none)")
    p.add_argument("--plot", default=None, help="write the timeline (rate, replicas, TTFT p50/p99) to this PNG")
    p.add_argument("--output", default=None, help="also write the JSON (with per-request results) here")
    p.set_defaults(func=run_burst_cmd)


def run_burst_cmd(args: argparse.Namespace) -> int:
    from railyard.bench.burst import BurstTrace, ServeReplicas, format_burst_table, run_burst, summarize_burst
    from railyard.bench.serve import ServeBenchConfig, emit_report
    from railyard.bench.workload import LengthRange

    trace = BurstTrace(args.rate, args.burst_factor, args.steady_s, args.burst_s, args.after_s)
    if (args.app is None) != (args.deployment is None):
        raise ConfigError("--app and --deployment name the Ray Serve deployment together: give both or neither")
    if not args.sample_period > 0:
        raise ConfigError("--sample-period must be > 0")
    cfg = ServeBenchConfig(url=args.url, model=args.model, num_prompts=0, input_len=LengthRange.parse(args.input_len),
                           output_len=LengthRange.parse(args.output_len), request_rate=args.rate, seed=args.seed,
                           api_key=args.api_key)
    replicas = None
    if args.app is not None:
        replicas = ServeReplicas(args.app, args.deployment, args.ray_address)
        replicas.connect()
    run = asyncio.run(run_burst(cfg, trace, replicas, args.sample_period))
    report = summarize_burst(cfg, trace, run, args.sample_period)
    if args.plot:
        from railyard.bench.plot import plot_burst_timeline

        report["plot"] = str(plot_burst_timeline(report, args.plot))
    return emit_report(report, format_burst_table(report), run.results, args.output, "railyard bench burst")
