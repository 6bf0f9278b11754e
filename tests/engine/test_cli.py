"""`railyard generate`: works on the embedded model; bad input is one line and exit code 2."""

from __future__ import annotations

import json

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
