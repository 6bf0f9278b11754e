"""`railyard generate`: works on the embedded model; bad input is one line and exit code 2."""

from __future__ import annotations

import io
import json
import sys

from railyard.cli import main


def test_generate_prints_json_per_prompt(tiny_model, capsys):
    rc = main(["generate", "--model", tiny_model, "--prompt", "hello", "--prompt", "world",
               "--max-tokens", "4", "--ignore-eos", "--json"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == ["hello", "world"]
    assert all(len(line["token_ids"]) == 4 and line["finish_reason"] == "length" for line in lines)


def test_bad_option_exits_2_with_one_line(tiny_model, capsys):
    rc = main(["generate", "--model", tiny_model, "--prompt", "x", "--block-size", "7"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == "railyard generate: error: block_size must be 8, 16 or 32, got 7"


def test_hub_id_exits_2_saying_weights_must_be_local(capsys):
    rc = main(["generate", "--model", "Qwen/Qwen2-7B", "--prompt", "x"])
    assert rc == 2
    assert "never downloads weights" in capsys.readouterr().err


class Terminal(io.StringIO):
    """stderr as a terminal: where progress bars belong."""

    def isatty(self) -> bool:
        return True


def test_generate_accepts_the_embedded_models_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAILYARD_CACHE", str(tmp_path))
    rc = main(["generate", "--model", "tiny-qwen2-seed0", "--prompt", "hi", "--max-tokens", "2", "--ignore-eos",
               "--json"])
    assert rc == 0 and len(json.loads(capsys.readouterr().out)["token_ids"]) == 2
    assert (tmp_path / "tiny-qwen2-seed0" / "config.json").is_file()  # the name the server calls it by


def test_generate_shows_a_progress_bar_on_a_terminal_only(tiny_model, monkeypatch, capsys):
    args = ["generate", "--model", tiny_model, "--prompt", "a", "--prompt", "b", "--max-tokens", "2"]
    assert main(args) == 0 and "generate" not in capsys.readouterr().err  # not a terminal: no bar
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(args) == 0
    assert "generate: 100%" in terminal.getvalue() and "2/2" in terminal.getvalue()


def test_the_thread_count_and_the_tensor_parallel_timeout_are_engine_flags(tiny_model):
    from railyard.cli import build_parser
    from railyard.engine.args import engine_config_from_args

    args = build_parser().parse_args(["serve", "--model", tiny_model, "--torch-threads", "2", "--tp-timeout-s", "30"])
    config = engine_config_from_args(args)
    assert (config.torch_threads, config.tp_timeout_s) == (2, 30.0)


def test_a_bad_thread_count_or_tensor_parallel_timeout_exits_2_naming_it(tiny_model, capsys):
    for flag, value, name in (("--torch-threads", "0", "torch_threads"), ("--tp-timeout-s", "0", "tp_timeout_s")):
        assert main(["generate", "--model", tiny_model, "--prompt", "x", flag, value]) == 2
        assert capsys.readouterr().err.strip().startswith(f"railyard generate: error: {name} must be")
