"""Running the checks bottom up (this node, then the cluster) and reporting them one line each."""

from __future__ import annotations

from typing import Callable, TextIO

from railyard.cluster.doctor.device_plugin import check_device_plugin
from railyard.cluster.doctor.driver import check_cuda_compat, check_local_mig, check_nvidia_smi, check_torch_gpus
from railyard.cluster.doctor.kernel_cache import check_kernel_cache
from railyard.cluster.doctor.kubectl import is_unreachable
from railyard.cluster.doctor.nodes import check_gfd_labels, check_gpu_capacity, check_gpu_taints, check_mig
from railyard.cluster.doctor.probe import COMMANDS, Output, Probe
from railyard.cluster.doctor.result import CheckResult
from railyard.cluster.doctor.toolkit import check_container_toolkit, check_device_files

NODE_CHECKS: tuple[Callable[[Probe], CheckResult], ...] = (
    check_nvidia_smi,
    check_cuda_compat,
    check_torch_gpus,
    check_container_toolkit,
    check_device_files,
    check_local_mig,
    check_kernel_cache,
)
CLUSTER_CHECKS: tuple[Callable[[Probe], CheckResult], ...] = (
    check_device_plugin,
    check_gpu_capacity,
    check_gfd_labels,
    check_gpu_taints,
    check_mig,
)
_MARKS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


def run_checks(probe: Probe, node: bool = True, cluster: bool = True) -> list[CheckResult]:
    """Run the node and/or cluster checks. kubectl's answer is reported once: when it has none (no kubectl, no
    cluster reachable) the remaining cluster checks are not run, since each would only say the same."""
    results = [check(probe) for check in NODE_CHECKS] if node else []
    if cluster:
        said = False
        for check in CLUSTER_CHECKS:
            result = check(probe)
            if result.name.startswith("kubectl get"):
                if said:
                    continue
                said = True
                if is_unreachable(result):
                    results.append(result)
                    break
            results.append(result)
    return results


def format_report(results: list[CheckResult]) -> str:
    """One line per check (a warning's or failure's fix on the same line), and a closing count."""
    lines = []
    for r in results:
        fix = f"; fix: {r.fix}" if r.fix and r.status in ("warn", "fail") else ""
        lines.append(f"[{_MARKS[r.status]}] {r.name}: {r.detail}{fix}")
    counts = {s: sum(r.status == s for r in results) for s in _MARKS}
    lines.append(
        f"doctor: {counts['pass']} ok, {counts['fail']} failing, {counts['warn']} warning, {counts['skip']} skipped"
    )
    return "\n".join(lines)


class ShowProgress:
    """A probe that says on a terminal which command the doctor is waiting for (a live one may take up to its
    timeout, kubectl against an unreachable cluster the longest); `done()` clears the line."""

    def __init__(self, probe: Probe, stream: TextIO) -> None:
        self.probe = probe
        self.stream = stream
        self.seen: list[str] = []

    def output(self, name: str) -> Output:
        if name not in self.seen:  # a command runs once; the checks that read it again wait for nothing
            self.seen.append(name)
            argv = COMMANDS[name][0]
            label = " ".join(argv[:3]) if argv[0] == "kubectl" else name
            self.stream.write(f"\r\033[Kdoctor: waiting for {label} ...")
            self.stream.flush()
        return self.probe.output(name)

    def done(self) -> None:
        self.stream.write("\r\033[K")
        self.stream.flush()
