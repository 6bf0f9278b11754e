"""This node's railyard kernel cache: whether an engine started here can keep its compiled kernels, whether any are
there yet, and how the last start met them (cold: compiled every kernel; warm: loaded them all)."""

from __future__ import annotations

import json

from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, passed, skipped, warned

NAME = "kernel cache"
FILL = ("fill it once: `railyard cache fill --config stack.yaml` here (or set the stack's kernel_cache so replicas "
        "share one)")


def check_kernel_cache(probe: Probe) -> CheckResult:
    out = probe.output("kernel-cache")
    if not out.found or not out.ok:
        return skipped(NAME, "not inspected (python3 did not run the probe)")
    try:
        info = json.loads(out.stdout)
    except ValueError:
        return skipped(NAME, "not inspected (the probe's output is not JSON)")
    where, kernels = info.get("dir", "?"), int(info.get("kernels", 0))
    if not info.get("writable"):
        return warned(NAME, f"{where} is not writable by this user: every engine start compiles every kernel",
                      "make it writable by the engine's user (uid 1000 in rendered pods), or set RAILYARD_CACHE")
    if kernels == 0:
        return warned(NAME, f"{where} holds no kernels: the next engine start here compiles every one (cold)", FILL)
    last = info.get("last_start") or {}
    said = ""
    if last.get("kernel_cache"):
        said = (f"; the last start here ({last.get('model', '?')}) was {last['kernel_cache']}: "
                f"{last.get('triton_compiled', '?')} of {last.get('triton_kernels', '?')} kernels compiled")
        if last.get("bytecode_cache"):
            said += f", its Python bytecode {last['bytecode_cache']} (the installation ships none)"
    return passed(NAME, f"{kernels} kernels in {where}{said}")
