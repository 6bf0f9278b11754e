"""The `railyard` command: each layer registers its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import sys

from railyard.errors import RailyardError

# Each module exposes register(subparsers); a sub-command sets `func(args) -> int`.
_COMMAND_MODULES = (
    "railyard.engine.cli",
    "railyard.api.cli",
    "railyard.bench.cli",
    "railyard.cluster.cli",
    "railyard.serve.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="railyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def command(args: argparse.Namespace):
    """The function that runs a parsed command line. `serve --config` belongs to layer 2 (Ray Serve), whose
    options `serve` lists; dispatching it here keeps the api from importing the layer above it."""
    if args.command == "serve" and getattr(args, "config", None):
        from railyard.serve.cli import run_serve_config

        return run_serve_config
    return args.func


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(command(args)(args) or 0)
    except (RailyardError, ValueError, FileNotFoundError) as exc:
        # One line, exit 2: bad input is the user's to fix, not a traceback.
        print(f"railyard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
