"""`railyard cluster up` / `railyard serve --config`: bad input is one line and exit 2, before Ray starts."""

from __future__ import annotations

import os

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


def test_an_unknown_proxy_is_refused(tmp_path, capsys):
    stack = tmp_path / "stack.yaml"
    stack.write_text("image: x\nmodels: [{name: m, model: /m}]\ningress: {proxy: nginx}\n")
    assert main(["cluster", "up", "-c", str(stack)]) == 2
    assert "ingress.proxy" in capsys.readouterr().err


@pytest.mark.parametrize(("proxy", "value"), [("haproxy", "1"), ("ray", "0")])
def test_the_local_ray_inherits_the_stacks_proxy(proxy, value, monkeypatch):
    """`cluster up` on a Ray of its own puts the choice in its environment before ray.init (Serve reads it in
    every Ray process); haproxy is what ray[serve] bundles on Linux."""
    from railyard.serve.cli import use_proxy
    from railyard.stack import Ingress

    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "neither")  # restored after the test, as use_proxy's writes
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "30")
    monkeypatch.delenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S")
    use_proxy(Ingress(proxy=proxy))
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == value
    # Behind HAProxy an ingress drains for seconds, not Ray's 30 (no outside load balancer on a Ray of its own).
    assert os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S") == ("2" if proxy == "haproxy" else None)


def test_haproxy_without_its_binary_is_one_line_and_exit_2(tmp_path, tiny_model, capsys, monkeypatch):
    stack = tmp_path / "stack.yaml"
    stack.write_text(f"image: x\nmodels: [{{name: m, model: {tiny_model}}}]\n")  # a checkpoint that is there
    import ray.serve._private.haproxy as haproxy

    def missing() -> str:
        raise FileNotFoundError("Could not find an HAProxy binary.")

    monkeypatch.setattr(haproxy, "get_haproxy_binary", missing)
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    assert main(["cluster", "up", "-c", str(stack)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ingress.proxy: ray" in err[0]
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
