"""`railyard cluster up` / `railyard serve --config`: bad input is one line and exit 2, before Ray starts."""

from __future__ import annotations

import pytest

from railyard.cli import main


@pytest.mark.parametrize("argv", [["cluster", "up", "-c"], ["serve", "--config"]])
def test_a_missing_stack_file_is_exit_2_with_one_line(argv, tmp_path, capsys):
    assert main([*argv, str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0]


def test_an_invalid_stack_names_the_field(tmp_path, capsys):
    stack = tmp_path / "stack.yaml"
    stack.write_text("image: x\nmodels: [{name: Bad_Name, model: /m}]\n")
    assert main(["cluster", "up", "-c", str(stack)]) == 2
    assert "models.0.name" in capsys.readouterr().err


def test_an_out_of_range_port_is_refused(tmp_path, capsys):
    stack = tmp_path / "stack.yaml"
    stack.write_text("image: x\nmodels: [{name: m, model: /m}]\n")
    assert main(["cluster", "up", "-c", str(stack), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
