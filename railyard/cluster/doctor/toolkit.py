"""What a container needs to be given this node's GPUs: the NVIDIA container toolkit and device files that
non-root pods can open."""

from __future__ import annotations

import re

from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, failed, passed

_DEVICE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


def check_container_toolkit(probe: Probe) -> CheckResult:
    name = "nvidia-container-cli"
    out = probe.output("nvidia-container-cli")
    if not out.found:
        return failed(
            name,
            "nvidia-container-cli not found: containers cannot be given GPUs",
            "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=containerd` "
            "and restart containerd",
        )
    if not out.ok:
        said = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[0]
        return failed(name, f"nvidia-container-cli failed: {said[:200]}", "reinstall nvidia-container-toolkit")
    version = re.search(r"cli-version:\s*([\w.\-]+)|version\s+([\d.]+)", out.stdout)
    found = next((g for g in version.groups() if g), "?") if version else "?"
    return passed(name, f"nvidia-container-cli {found}")


def check_device_files(probe: Probe) -> CheckResult:
    name = "/dev/nvidia* permissions"
    out = probe.output("dev-nvidia")
    lines = [line.split() for line in out.stdout.strip().splitlines() if line.strip()]
    if not out.ok or not lines:
        return failed(
            name,
            "no /dev/nvidia* device files",
            "the driver's device nodes are missing: run `nvidia-modprobe -c 0 -u` (or load nvidia and nvidia-uvm)",
        )
    # Only the character devices matter; /dev/nvidia-caps is a directory (0755 is right for it).
    paths = {p[0]: p[1] for p in lines if len(p) >= 2 and _DEVICE.match(p[0])}
    missing = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if p not in paths]
    if missing:
        return failed(
            name,
            f"missing {', '.join(missing)}",
            "load the nvidia-uvm module: `nvidia-modprobe -u -c=0` (CUDA needs /dev/nvidia-uvm)",
        )
    closed = [p for p, mode in paths.items() if len(mode) >= 3 and int(mode[-1]) & 6 != 6]
    if closed:
        return failed(
            name,
            f"not readable and writable by other users (non-root pods): {', '.join(sorted(closed))}",
            "set `options nvidia NVreg_DeviceFileMode=0666` in /etc/modprobe.d/nvidia.conf and reload the driver",
        )
    return passed(name, f"{len(paths)} device files, mode rw for all")
