"""The `railyard` command as a new user meets it: --version, and help that says every option's default."""

from __future__ import annotations

import argparse

import pytest

from railyard import __version__
from railyard.cli import build_parser, main


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"railyard {__version__}"


@pytest.mark.parametrize("command", [("generate",), ("serve",), ("bench", "throughput")], ids=" ".join)
def test_every_option_of_the_command_says_its_default(command):
    parser = subparser(build_parser(), *command)
    formatter = parser.formatter_class(prog=parser.prog)
    silent = [a.option_strings[0] for a in parser._actions if a.option_strings and a.default is not argparse.SUPPRESS
              and "default" not in (formatter._expand_help(a) if a.help else "")]
    assert silent == []


def test_default_shown_in_help_is_the_real_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-tokens MAX_TOKENS most tokens to generate per output (default: 32)" in text
    assert "--block-size BLOCK_SIZE tokens per KV-cache block (8, 16 or 32) (default: 16)" in text  # EngineConfig's
