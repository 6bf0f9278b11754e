"""doctor's report: every check run bottom up, one line each, kubectl's answer once; a healthy recording passes."""

from __future__ import annotations

import io

from railyard.cli import main
from railyard.cluster.doctor import format_report, run_checks
from railyard.cluster.doctor.probe import LiveProbe, RecordedProbe
from railyard.cluster.doctor.report import ShowProgress

from .conftest import GOOD
from .test_kubectl import NO_KUBECONFIG


# The healthy recording predates the kernel-cache check (its file is absent): that one check skips.
HEALTHY = ["pass"] * 6 + ["skip"] + ["pass"] * 5


def test_the_healthy_recording_passes_every_check():
    results = run_checks(RecordedProbe(GOOD))
    assert [r.status for r in results] == HEALTHY and results[6].name == "kernel cache"
    assert format_report(results).endswith("doctor: 11 ok, 0 failing, 0 warning, 1 skipped")


def test_without_kubectl_the_cluster_checks_are_skipped_once(recording):
    (recording / "nodes.json").unlink()
    (recording / "daemonsets.json").unlink()
    results = run_checks(RecordedProbe(recording), node=False)
    assert [(r.name, r.status) for r in results] == [("kubectl get daemonsets", "skip")]


def test_fail_anywhere_makes_the_report_say_so(recording):
    (recording / "nvidia-container-cli.txt").unlink()
    report = format_report(run_checks(RecordedProbe(recording)))
    assert "[FAIL] nvidia-container-cli" in report
    assert "fix: install nvidia-container-toolkit" in report


def test_every_failed_check_is_one_line_with_its_fix(recording):
    (recording / "nvidia-container-cli.txt").unlink()
    (recording / "nodes.json").write_text(NO_KUBECONFIG)
    (recording / "nodes.json.rc").write_text("1")
    (recording / "daemonsets.json").write_text(NO_KUBECONFIG)
    (recording / "daemonsets.json.rc").write_text("1")
    results = run_checks(RecordedProbe(recording))
    lines = format_report(results).splitlines()
    assert len(lines) == len(results) + 1
    failing = [line for line in lines if line.startswith("[FAIL]")]
    assert len(failing) == 2 and all("; fix: " in line for line in failing)
    assert not any("memcache.go" in line or "did you specify" in line for line in lines)


def test_the_cli_says_no_cluster_reachable_and_exits_1(recording, capsys):
    (recording / "daemonsets.json").write_text(NO_KUBECONFIG)
    (recording / "daemonsets.json.rc").write_text("1")
    assert main(["doctor", "--recorded", str(recording), "--cluster-only"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[FAIL] kubectl get daemonsets: no cluster reachable: kubectl has no cluster configured")
    assert out[1] == "doctor: 0 ok, 1 failing, 0 warning, 0 skipped"


def test_progress_names_each_command_once_while_it_waits_then_clears_its_line():
    stream = io.StringIO()
    progress = ShowProgress(RecordedProbe(GOOD), stream)
    results = run_checks(progress)
    progress.done()
    shown = stream.getvalue()
    assert [r.status for r in results] == HEALTHY
    for label in ("nvidia-smi", "torch", "nvidia-container-cli", "kubectl get daemonsets", "kubectl get nodes"):
        assert shown.count(f"waiting for {label} ...") == 1
    assert shown.endswith("\r\033[K")


def test_the_live_probe_runs_each_command_once():
    probe = LiveProbe(timeout_s=10)
    assert probe.output("nvidia-smi") is probe.output("nvidia-smi")
