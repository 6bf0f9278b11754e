"""The cluster's objects as kubectl lists them, and kubectl's failures said in one line a user can act on.

kubectl reports a cluster it cannot reach with a burst of klog lines (`E1203 10:11:12 ... memcache.go:265]
couldn't get current server API group list: ...`) and a summary; the doctor prints one sentence instead,
starting with "no cluster reachable" when no API server answered.
"""

from __future__ import annotations

import json
import re
from typing import Any

from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, failed, skipped

UNREACHABLE = "no cluster reachable"
_KLOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.-]+:\d+\] ")
_REFUSED = re.compile(r"connection to the server (\S+) was refused")
_FORBIDDEN = re.compile(r"User \"([^\"]+)\" cannot list resource \"([^\"]+)\"")

NO_CLUSTER_FIX = ("point kubectl at the cluster (--kubeconfig, $KUBECONFIG or `kubectl config use-context`), "
                  "or run `railyard doctor --node-only` on a node without cluster access")


def kubectl_items(probe: Probe, name: str) -> list[dict[str, Any]] | CheckResult:
    """`kubectl get <name>`'s items, or the one-line result that says why there are none."""
    check = f"kubectl get {name}"
    out = probe.output(name)
    if not out.found:
        return skipped(check, "kubectl not found: cluster checks skipped")
    if not out.ok:
        detail, fix = explain_failure(out.stderr or out.stdout, name)
        return failed(check, detail, fix)
    try:
        return json.loads(out.stdout).get("items", [])
    except ValueError:
        return failed(check, "kubectl did not print JSON", "re-run with `-o json`")


def explain_failure(stderr: str, resource: str) -> tuple[str, str]:
    """(detail, fix) for a failed kubectl: unreachable API server, no kubeconfig, RBAC, or kubectl's own line."""
    lines = [_KLOG.sub("", line).strip() for line in stderr.strip().splitlines() if line.strip()]
    text = "\n".join(lines)
    if refused := _REFUSED.search(text):
        where = refused.group(1)
        why = "kubectl has no cluster configured" if where.startswith("localhost:8080") else f"{where} refused"
        return f"{UNREACHABLE}: {why}", NO_CLUSTER_FIX
    if "timed out" in text or "Unable to connect to the server" in text or "dial tcp" in text:
        why = _summary(lines).removeprefix("Unable to connect to the server: ")
        why = re.sub(r" on [\d.:\[\]]+:", ":", re.sub(r"^dial tcp:? (lookup )?", "", why))  # less the resolver
        return f"{UNREACHABLE}: {why}", NO_CLUSTER_FIX
    if any(s in text for s in ("no such file or directory", "does not exist", "Error in configuration",
                                "invalid configuration")):
        return f"{UNREACHABLE}: kubeconfig problem: {_summary(lines)}", NO_CLUSTER_FIX
    if "Unauthorized" in text or "must be logged in" in text:
        return ("the cluster refused kubectl's credentials (Unauthorized)",
                "refresh the kubeconfig's credentials (e.g. your cloud CLI's get-credentials command)")
    if forbidden := _FORBIDDEN.search(text):
        return (f"{forbidden.group(1)} may not list {forbidden.group(2)} (RBAC Forbidden)",
                f"grant it get/list on {resource} (a ClusterRole), or run the doctor with a kubeconfig that has it")
    return f"kubectl failed: {_summary(lines)}", "check the kubeconfig context and your RBAC (get nodes, daemonsets)"


def is_unreachable(result: CheckResult) -> bool:
    """A kubectl result after which no other cluster check can learn anything (no kubectl, no cluster)."""
    return result.name.startswith("kubectl get") and (
        result.status == "skip" or result.detail.startswith(UNREACHABLE))


def _summary(lines: list[str]) -> str:
    """kubectl's last line is its summary; klog prefixes are already gone. One line, at most 200 characters."""
    return (lines[-1] if lines else "no output")[:200]
