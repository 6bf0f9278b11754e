"""`railyard bench serve`: flags, run, JSON on stdout, table on stderr, optional plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import math

from railyard.errors import ConfigError


def register_serve(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("serve", help="load an OpenAI-compatible server; TTFT/TPOT/ITL/latency percentiles")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (without /v1)")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--num-prompts", type=int, default=200, help="requests to send")
    p.add_argument("--input-len", default="128", help="N or LOW-HIGH prompt tokens (seeded uniform)")
    p.add_argument("--output-len", default="128", help="N or LOW-HIGH output tokens (EOS ignored)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrival rate in requests/s (default: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="most requests in flight at once (default: no limit)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the prompts, lengths and arrivals: the same seed sends the same prompts, which a "
                        "server's prefix cache then serves from memory (give each run of an A/B comparison its own)")
    p.add_argument("--prefix-groups", type=int, default=0,
                   help="prompts start with one of this many shared prefixes (0: none), e.g. system prompts")
    p.add_argument("--shared-prefix-len", type=int, default=0, help="tokens of each shared prefix")
    p.add_argument("--structured-outputs", default=None, metavar="JSON|@FILE",
                   help="constrain every request: a JSON object sent as its `structured_outputs` (vLLM's field), e.g. "
                        "'{\"json\": {...schema...}}'; the constraint must outlast --output-len (default: none)")
    p.add_argument("--unique-schemas", action="store_true",
                   help="with a JSON schema: vary each request's schema (its description) so every one is first-seen "
                        "by the server's grammar cache")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default: none)")
    p.add_argument("--plot", default=None, help="write latency percentiles over time to this PNG (default: no plot)")
    p.add_argument("--output", default=None,
                   help="also write the JSON (with per-request results) here (default: stdout only)")
    p.set_defaults(func=run_serve_bench_cmd)


def run_serve_bench_cmd(args: argparse.Namespace) -> int:
    from railyard.bench.serve import (
        ServeBenchConfig, emit_report, format_table, prefix_cache_hit_rate, run_serve_bench, scrape_server_counters,
        server_steps, summarize)
    from railyard.bench.workload import LengthRange

    if args.num_prompts < 1:
        raise ConfigError("--num-prompts must be at least 1")
    if not args.request_rate > 0:
        raise ConfigError("--request-rate must be positive (leave it out to send everything at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ConfigError("--max-concurrency must be at least 1")
    structured = _structured_outputs(args.structured_outputs, args.unique_schemas)
    cfg = ServeBenchConfig(url=args.url, model=args.model, num_prompts=args.num_prompts,
                           input_len=LengthRange.parse(args.input_len), output_len=LengthRange.parse(args.output_len),
                           request_rate=args.request_rate, max_concurrency=args.max_concurrency, seed=args.seed,
                           api_key=args.api_key, prefix_groups=args.prefix_groups,
                           shared_prefix_len=args.shared_prefix_len, structured_outputs=structured,
                           unique_schemas=args.unique_schemas)
    before = asyncio.run(scrape_server_counters(cfg))
    results, duration = asyncio.run(run_serve_bench(cfg))
    after = asyncio.run(scrape_server_counters(cfg))
    summary = summarize(cfg, results, duration, server_steps(before, after, duration),
                        prefix_cache_hit_rate(before, after))
    if args.plot:
        from railyard.bench.plot import plot_latency_over_time

        summary["plot"] = str(plot_latency_over_time(results, args.plot))
    return emit_report(summary, format_table(summary), results, args.output, "railyard bench serve")


def _structured_outputs(value: str | None, unique: bool) -> dict | None:
    """--structured-outputs as a dict (inline JSON or @file); --unique-schemas needs a JSON schema in it."""
    if value is None:
        if unique:
            raise ConfigError("--unique-schemas varies a JSON schema: give one with --structured-outputs")
        return None
    try:
        text = open(value[1:]).read() if value.startswith("@") else value
        parsed = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--structured-outputs must be a JSON object or @file of one: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConfigError("--structured-outputs must be a JSON object, e.g. '{\"regex\": \"[a-z]+\"}'")
    if unique and not isinstance(parsed.get("json"), dict):
        raise ConfigError("--unique-schemas varies a JSON schema: --structured-outputs needs a \"json\" object")
    return parsed
