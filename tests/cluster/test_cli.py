"""The layer-1 commands through the real `railyard` CLI: exit codes, output, one-line errors, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from railyard.cli import main

from .conftest import EXAMPLES, FIXTURES

GOOD = FIXTURES / "doctor" / "good"
NODES = GOOD / "nodes.json"


def test_render_writes_yaml_that_validate_accepts(tmp_path, capsys):
    out = tmp_path / "rendered.yaml"
    assert main(["deploy", "render", "-c", str(EXAMPLES / "stack.yaml"), "-o", str(out)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == [
        "RayService",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
    ]
    assert main(["deploy", "validate", str(out), "--kubernetes-version", "1.30"]) == 0
    assert "OK" in capsys.readouterr().out


def test_render_to_stdout_in_deployment_mode(capsys):
    stack = EXAMPLES / "stack-tp2-two-models.yaml"
    assert main(["deploy", "render", "-c", str(stack)]) == 0
    assert "kind: RayService" in capsys.readouterr().out


def test_validate_reports_the_field_and_exits_1(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "x"},
                "spec": {"maxUnavailable": 1, "selecter": {}},
            }
        )
    )
    assert main(["deploy", "validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert (
        f"ERROR {bad}: PodDisruptionBudget/x: spec: Additional properties are not allowed ('selecter' was unexpected)"
        in out
    )


def test_bad_stack_is_one_line_and_exit_2(tmp_path, capsys):
    stack = tmp_path / "s.yaml"
    stack.write_text("image: x\nmodels: [{name: M_1, model: /m}]\n")
    assert main(["deploy", "render", "-c", str(stack)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("railyard deploy: error:")
    assert "models.0.name" in err
    assert "\n" not in err


def test_doctor_on_a_healthy_recording_exits_0(capsys):
    assert main(["doctor", "--recorded", str(GOOD)]) == 0
    assert "11 ok, 0 failing" in capsys.readouterr().out


def test_doctor_fails_the_deploy_gate_on_a_failure(tmp_path, capsys):
    import shutil

    shutil.copytree(GOOD, tmp_path / "rec")
    (tmp_path / "rec" / "nvidia-container-cli.txt").unlink()
    assert main(["doctor", "--recorded", str(tmp_path / "rec"), "--json"]) == 1
    results = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert results["nvidia-container-cli"]["status"] == "fail"


def test_plan_prints_placement_and_sizing(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "requests_per_s": 4.0,
                "output_tokens_per_s": 900.0,
                "total_tokens_per_s": 2000.0,
                "num_prompts": 100,
                "elapsed_s": 25.0,
            }
        )
    )
    code = main(
        [
            "plan",
            "--nodes",
            str(NODES),
            "-c",
            str(EXAMPLES / "stack.yaml"),
            "--profile",
            str(bench),
            "--target-rps",
            "10",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["all_placed"] is True
    assert result["sizing"][0]["needed_replicas"] == 4  # 10 / (4 * 0.8) = 3.1
    assert result["sizing"][0]["kv_cache"]["bytes_per_block"] == 2 * 28 * 4 * 128 * 16 * 2


def test_plan_exits_1_when_something_stays_pending(capsys):
    code = main(["plan", "--nodes", str(NODES), "-c", str(EXAMPLES / "stack-tp2-two-models.yaml")])
    out = capsys.readouterr().out
    assert code == 1
    assert "Pending: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector." in out


def test_plan_without_nodes_is_a_usage_error(capsys):
    assert main(["plan", "-c", str(EXAMPLES / "stack.yaml")]) == 2
    assert "plan needs --nodes" in capsys.readouterr().err


def test_layer_1_commands_run_without_torch(tmp_path):
    # torch blocked: any `import torch` on these paths would fail the command.
    code = (
        "import sys; sys.modules['torch'] = None; from railyard.cli import main; "
        f"sys.exit(main(['deploy', 'render', '-c', {str(EXAMPLES / 'stack.yaml')!r}, '-o', {str(tmp_path / 'r.yaml')!r}]) "
        f"or main(['doctor', '--recorded', {str(GOOD)!r}]) "
        f"or main(['plan', '--nodes', {str(NODES)!r}, '-c', {str(EXAMPLES / 'stack.yaml')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_plan_the_examples_at_max_replicas_on_the_example_inventory(capsys):
    code = main(
        ["plan", "--nodes", str(EXAMPLES / "nodes.yaml"), "-c", str(EXAMPLES / "stack-tp2-two-models.yaml"), "--at-max"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.rstrip().endswith("7/7 pods scheduled, 6/6 Serve replicas placed")


def test_target_rate_without_a_profile_is_a_usage_error(capsys):
    assert main(["plan", "--nodes", str(NODES), "-c", str(EXAMPLES / "stack.yaml"), "--target-rps", "5"]) == 2
    assert "--target-rps and --profile go together" in capsys.readouterr().err


def test_a_malformed_inventory_is_one_line_naming_the_entry(tmp_path, capsys):
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n  - name: a\n    taints: [{value: x}]\n")
    assert main(["plan", "--nodes", str(inventory), "-c", str(EXAMPLES / "stack.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nodes[0]: malformed entry" in err
    assert "\n" not in err


def test_the_readme_plan_command_places_the_example_stack(capsys):
    assert main(["plan", "--nodes", str(EXAMPLES / "nodes.yaml"), "--config", str(EXAMPLES / "stack.yaml")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("5/5 pods scheduled, 4/4 Serve replicas placed")


def test_plan_refuses_a_profile_measured_on_another_model_and_device(tiny_model, tmp_path, capsys):
    assert main(["bench", "throughput", "--model", tiny_model, "--num-prompts", "2", "--input-len", "8",
                 "--output-len", "2", "--warmup-prompts", "0"]) == 0
    bench = tmp_path / "bench.json"
    bench.write_text(capsys.readouterr().out)
    code = main(["plan", "--nodes", str(NODES), "-c", str(EXAMPLES / "stack.yaml"), "--profile", str(bench),
                 "--target-rps", "10"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--profile {bench} was measured on another model ({tiny_model}: " in err
    assert "and another device (cpu, not NVIDIA-H200)" in err
