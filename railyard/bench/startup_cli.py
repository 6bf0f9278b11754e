"""`railyard bench startup`: flags, the checkpoint (written first for a named shape), runs, JSON and a table."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from railyard.bench.checkpoint import PAGE_CACHE_MODES
from railyard.errors import ConfigError


def register_startup(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("startup", help="cold and warm start of `railyard serve` to /health ready, by phase")
    p.add_argument("--checkpoint-dir", required=True,
                   help="the safetensors checkpoint to serve; with --model and no config.json there, a random-weight "
                        "checkpoint of that shape is written there first")
    p.add_argument("--model", default=None,
                   help="a named shape (qwen2-7b, ...) to write into an empty --checkpoint-dir")
    p.add_argument("--seed", type=int, default=0, help="seed of the written checkpoint's random weights")
    p.add_argument("--runs", type=int, default=3, help="starts: the first with an empty railyard cache, the rest warm")
    p.add_argument("--cache-dir", default=None,
                   help="the railyard cache the runs use ($RAILYARD_CACHE); must be empty or absent, so the first run "
                        "is cold (default: a fresh temporary directory, removed afterwards)")
    p.add_argument("--page-cache", default="warm", choices=PAGE_CACHE_MODES,
                   help="the checkpoint's page-cache state: warm: read it once before the first run; drop: drop its "
                        "pages before every run (each load reads the disk); as-is: leave it")
    p.add_argument("--serve-args", default="",
                   help="more `railyard serve` flags, one string (e.g. '--max-model-len 4096')")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take before it counts as failed")
    p.add_argument("--output", default=None, help="also write the JSON here")
    p.set_defaults(func=run_startup_cmd)


def run_startup_cmd(args: argparse.Namespace) -> int:
    from railyard.bench.startup import format_startup_table, run_startup

    if args.runs < 1:
        raise ConfigError("--runs must be at least 1")
    checkpoint = Path(args.checkpoint_dir).expanduser()
    written = ensure_checkpoint(checkpoint, args.model, args.seed)
    own_cache = args.cache_dir is None
    cache = Path(tempfile.mkdtemp(prefix="railyard-cache-")) if own_cache else Path(args.cache_dir).expanduser()
    if not own_cache and cache.exists() and any(cache.iterdir()):
        raise ConfigError(f"--cache-dir {cache} is not empty: the first run would not be cold; give an empty one")
    try:
        report = run_startup(checkpoint, args.runs, cache, args.page_cache, shlex.split(args.serve_args), args.timeout)
    finally:
        if own_cache:
            shutil.rmtree(cache, ignore_errors=True)
    report["checkpoint_written"] = written
    print(format_startup_table(report), file=sys.stderr)
    print(json.dumps(report, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))
    return 0


def ensure_checkpoint(path: Path, shape: str | None, seed: int) -> dict | None:
    """Write the shape's random-weight checkpoint into path unless one is there; what was written (None: reused)."""
    if (path / "config.json").is_file():
        return None
    if shape is None:
        raise ConfigError(f"{path} holds no checkpoint (no config.json): give --model SHAPE to write one there")
    from railyard.bench.checkpoint import write_random_checkpoint
    from railyard.shapes import shape_config

    config = shape_config(shape)
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"{path} is not empty but holds no config.json: give an empty or absent directory")
    return write_random_checkpoint(config, path, seed).as_dict()
