"""kubectl's failures as the doctor reports them: one line a user can act on, never kubectl's raw stderr, and
"no cluster reachable" when no API server answers. The stderr samples are kubectl's own wording (the
no-kubeconfig, missing-file and unknown-context ones as kubectl 1.32 printed them on this machine)."""

from __future__ import annotations

import pytest

from railyard.cluster.doctor import run_checks
from railyard.cluster.doctor.probe import RecordedProbe

KLOG = ('E1203 08:55:55.939100   18941 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API '
        'group list: Get \\"{url}/api?timeout=32s\\": dial tcp {addr}: {why}"\n')
NO_KUBECONFIG = KLOG.format(url="http://localhost:8080", addr="[::1]:8080", why="connect: connection refused") * 5 + (
    "The connection to the server localhost:8080 was refused - did you specify the right host or port?\n")
SERVER_DOWN = KLOG.format(url="https://10.0.0.1:6443", addr="10.0.0.1:6443", why="i/o timeout") + (
    "Unable to connect to the server: dial tcp 10.0.0.1:6443: i/o timeout\n")
NO_SUCH_HOST = "Unable to connect to the server: dial tcp: lookup k8s.example.com on 127.0.0.53:53: no such host\n"
REFUSED = KLOG.format(url="https://10.0.0.1:6443", addr="10.0.0.1:6443", why="connect: connection refused") + (
    "The connection to the server 10.0.0.1:6443 was refused - did you specify the right host or port?\n")
NO_FILE = "error: stat /etc/kube/prod.yaml: no such file or directory\n"
BAD_CONTEXT = "Error in configuration: context was not found for specified context: prod\n"
FORBIDDEN = ('Error from server (Forbidden): daemonsets.apps is forbidden: User "system:serviceaccount:default:doctor" '
             'cannot list resource "daemonsets" in API group "apps" at the cluster scope\n')
UNAUTHORIZED = "error: You must be logged in to the server (Unauthorized)\n"


def _kubectl_fails(recording, stderr: str, returncode: int = 1) -> None:
    for name in ("daemonsets.json", "nodes.json"):
        (recording / name).write_text(stderr)
        (recording / f"{name}.rc").write_text(str(returncode))


@pytest.mark.parametrize(("stderr", "reason"), [
    (NO_KUBECONFIG, "no cluster reachable: kubectl has no cluster configured"),
    (SERVER_DOWN, "no cluster reachable: 10.0.0.1:6443: i/o timeout"),
    (NO_SUCH_HOST, "no cluster reachable: k8s.example.com: no such host"),
    (REFUSED, "no cluster reachable: 10.0.0.1:6443 refused"),
    (NO_FILE, "no cluster reachable: kubeconfig problem: error: stat /etc/kube/prod.yaml: no such file or directory"),
    (BAD_CONTEXT, "no cluster reachable: kubeconfig problem: Error in configuration: context was not found for "
                  "specified context: prod"),
])
def test_without_a_reachable_cluster_the_doctor_says_so_in_one_line(recording, stderr, reason):
    _kubectl_fails(recording, stderr)
    (result,) = run_checks(RecordedProbe(recording), node=False)
    assert (result.status, result.detail) == ("fail", reason)
    assert "--node-only" in result.fix


def test_kubectl_timing_out_is_no_cluster_reachable(recording):
    _kubectl_fails(recording, "kubectl timed out after 30s", returncode=124)  # what LiveProbe records on timeout
    (result,) = run_checks(RecordedProbe(recording), node=False)
    assert result.detail == "no cluster reachable: kubectl timed out after 30s"


def test_rbac_refusal_names_who_may_not_list_what(recording):
    _kubectl_fails(recording, FORBIDDEN)
    result = run_checks(RecordedProbe(recording), node=False)[0]
    assert result.detail == "system:serviceaccount:default:doctor may not list daemonsets (RBAC Forbidden)"
    assert "ClusterRole" in result.fix


def test_rejected_credentials_say_so(recording):
    _kubectl_fails(recording, UNAUTHORIZED)
    result = run_checks(RecordedProbe(recording), node=False)[0]
    assert result.detail == "the cluster refused kubectl's credentials (Unauthorized)"


class _Asked(RecordedProbe):
    """The recorded probe, noting which commands the checks asked for."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.asked: list[str] = []

    def output(self, name):
        self.asked.append(name)
        return super().output(name)


def test_once_no_cluster_is_reachable_no_other_kubectl_command_is_waited_for(recording):
    _kubectl_fails(recording, SERVER_DOWN)
    probe = _Asked(recording)
    results = run_checks(probe, node=False)
    assert [r.name for r in results] == ["kubectl get daemonsets"]
    assert probe.asked == ["daemonsets"]
