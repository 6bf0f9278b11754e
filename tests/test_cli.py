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


@pytest.mark.parametrize("command", [("generate",), ("serve",), ("bench", "throughput"), ("bench", "serve"),
                                     ("cluster", "up")], ids=" ".join)
def test_every_option_of_the_command_says_its_default(command):
    parser = subparser(build_parser(), *command)
    formatter = parser.formatter_class(prog=parser.prog)
    silent = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.required
              and a.default is not argparse.SUPPRESS
              and "default" not in (formatter._expand_help(a) if a.help else "")]
    assert silent == []


def test_default_shown_in_help_is_the_real_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-tokens MAX_TOKENS most tokens to generate per output (default: 32)" in text
    assert "--block-size BLOCK_SIZE tokens per KV-cache block (8, 16 or 32) (default: 16)" in text  # EngineConfig's


def every_option(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, action) of every option of every sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from every_option(child, (*path, name))
        elif action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, action


def test_every_option_of_every_command_has_help():
    assert [(" ".join(path), a.option_strings[0]) for path, a in every_option(build_parser()) if not a.help] == []


def test_the_token_budgets_stated_default_is_what_the_engine_config_resolves_to():
    from railyard.engine.config import EngineConfig

    config = EngineConfig()
    config.resolve(model_max_len=4096)
    action = next(a for path, a in every_option(build_parser()) if path == ("serve",)
                  and "--max-num-batched-tokens" in a.option_strings)
    assert f"(default: max({config.max_num_batched_tokens}, --max-num-seqs) with chunked prefill" in action.help


@pytest.mark.parametrize("argv, usage", [(["serve", "--prot", "8000"], "usage: railyard serve "),
                                         (["cluster", "up", "-c", "x.yaml", "--bogus"], "usage: railyard cluster up "),
                                         (["bench", "serve", "--model", "m", "--nope"], "usage: railyard bench serve ")],
                         ids=["serve", "cluster up", "bench serve"])
def test_a_bad_flag_shows_the_sub_commands_usage_and_exits_2(argv, usage, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage), err
    assert f"error: unrecognized arguments: {argv[-2] if argv[-1] == '8000' else argv[-1]}" in err
