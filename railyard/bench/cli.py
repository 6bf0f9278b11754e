"""`railyard bench ...` sub-commands."""

from __future__ import annotations

import argparse
import json

from railyard.engine.args import add_engine_args, engine_config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print JSON")
    kinds = bench.add_subparsers(dest="bench_command", required=True)

    tp = kinds.add_parser("throughput", help="offline throughput of one engine on a synthetic workload")
    tp.add_argument("--num-prompts", type=int, default=64)
    tp.add_argument("--input-len", default="32-128", help="N or LOW-HIGH prompt tokens (seeded uniform)")
    tp.add_argument("--output-len", default="32", help="N or LOW-HIGH output tokens (EOS ignored)")
    tp.add_argument("--workload-seed", type=int, default=0)
    add_engine_args(tp)
    tp.set_defaults(func=run_throughput_cmd)


def run_throughput_cmd(args: argparse.Namespace) -> int:
    from railyard.bench.throughput import build_engine, run_throughput
    from railyard.bench.workload import LengthRange
    from railyard.errors import ConfigError

    if args.num_prompts < 1:
        raise ConfigError("--num-prompts must be at least 1")
    input_len, output_len = LengthRange.parse(args.input_len), LengthRange.parse(args.output_len)
    engine = build_engine(engine_config_from_args(args))
    result = run_throughput(engine, args.num_prompts, input_len, output_len, args.workload_seed)
    print(json.dumps(result.to_dict(), indent=1))
    return 0
