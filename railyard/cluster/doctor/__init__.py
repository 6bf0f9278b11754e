"""`railyard doctor`: preflight of the GPU stack a replica depends on, bottom up: this node's driver and CUDA
(driver.py), the container toolkit and device files (toolkit.py), then the cluster's device plugin
(device_plugin.py) and its GPU nodes and labels (nodes.py), read through kubectl (kubectl.py).

Each check passes, warns or fails, and every warning or failure carries the fix, on one line (report.py).
Checks only read outputs through a Probe (probe.py), so each failure mode is testable from recorded outputs.
"""

from railyard.cluster.doctor.report import format_report, run_checks
from railyard.cluster.doctor.result import CheckResult

__all__ = ["CheckResult", "run_checks", "format_report"]
