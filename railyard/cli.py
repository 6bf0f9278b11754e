"""The `railyard` command: each layer registers its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time

from railyard import __version__
from railyard.errors import RailyardError, Stopped

# When railyard started: start-up reports count from here, not from the process's start (a shell that ran
# `pip install ... && exec railyard serve` started the process long before railyard; the interpreter's own
# start, before this line, is tens of milliseconds).
STARTED_AT = time.time()

# Each module exposes register(subparsers); a sub-command sets `func(args) -> int`.
_COMMAND_MODULES = (
    "railyard.engine.cli",
    "railyard.api.cli",
    "railyard.bench.cli",
    "railyard.cluster.cli",
    "railyard.serve.cli",
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it already says what happens when left out."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text or action.default in (None, argparse.SUPPRESS):
            return text  # a None default means "not set": the help itself says what that does
        if isinstance(action.default, bool):
            shown = "on" if action.default else "off"
        else:
            shown = "none" if action.default == [] else "%(default)s"
        return f"{text} (default: {shown})"


def _format_all(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _format_all(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="railyard", description=__doc__)
    parser.add_argument("--version", action="version", version=f"railyard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _format_all(parser)
    return parser


def command(args: argparse.Namespace):
    """The function that runs a parsed command line. `serve --config` belongs to layer 2 (Ray Serve), whose
    options `serve` lists; dispatching it here keeps the api from importing the layer above it."""
    if args.command == "serve" and getattr(args, "config", None):
        from railyard.serve.cli import run_serve_config

        return run_serve_config
    return args.func


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (deepest) sub-command a parsed command line chose, e.g. `cluster up`'s."""
    while True:
        subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, subs.dest, None) if subs is not None else None
        if name not in getattr(subs, "choices", {}):
            return parser
        parser = subs.choices[name]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the sub-command's parser, with its usage (argparse's own says the top level's)
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.started_at = STARTED_AT
    try:
        return int(command(args)(args) or 0)
    except (RailyardError, ValueError, FileNotFoundError) as exc:
        # One line, exit 2: bad input is the user's to fix, not a traceback.
        print(f"railyard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Stopped as stop:  # Ctrl-C or SIGTERM: a clean stop, with the shell's code for that signal
        return stop.exit_code
    except KeyboardInterrupt:
        return Stopped(signal.SIGINT).exit_code


def entry() -> int:
    """The `railyard` console script (and `python -m railyard.cli`): the process-wide set-up a command needs before
    its imports (where Python keeps bytecode), then main, which callers in a process of their own (tests) call
    without it."""
    from railyard.engine.startup.caches import configure_bytecode_cache

    configure_bytecode_cache()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
