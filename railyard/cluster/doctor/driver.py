"""This node's driver and CUDA: nvidia-smi answers, torch's CUDA fits the driver, torch sees the GPUs,
and the GPUs agree on MIG mode."""

from __future__ import annotations

import json
import re
from typing import Any

from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, failed, passed, skipped, warned


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def parse_nvidia_smi(text: str) -> dict[str, str]:
    """Driver version and the newest CUDA version the driver supports, from nvidia-smi's header."""
    out = {}
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    if driver:
        out["driver"] = driver.group(1)
    if cuda:
        out["cuda"] = cuda.group(1)
    return out


def parse_gpu_query(text: str) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=index,name,driver_version,memory.total,mig.mode.current`."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            rows.append({"index": parts[0], "name": parts[1], "driver": parts[2], "memory": parts[3], "mig": parts[4]})
    return rows


def check_nvidia_smi(probe: Probe) -> CheckResult:
    name = "nvidia-smi"
    out = probe.output("nvidia-smi")
    if not out.found:
        return failed(
            name,
            "nvidia-smi not found: no NVIDIA driver on this node",
            "install the NVIDIA datacenter driver (or let the GPU Operator's driver DaemonSet do it), then re-run",
        )
    if not out.ok:
        said = (out.stderr or out.stdout).strip()
        return failed(
            name,
            f"nvidia-smi failed: {said.splitlines()[0] if said else f'exit {out.returncode}'}",
            "the driver is installed but not loaded: check `dmesg | grep -i nvrm`, rebuild the module for the "
            "running kernel (dkms) or reboot after the driver install",
        )
    info = parse_nvidia_smi(out.stdout)
    if "driver" not in info:
        return warned(
            name, "could not read the driver version from nvidia-smi", "run `nvidia-smi` by hand and check its header"
        )
    gpus = parse_gpu_query(probe.output("nvidia-smi-query").stdout)
    names = sorted({g["name"] for g in gpus})
    return passed(
        name, f"driver {info['driver']}, CUDA {info.get('cuda', '?')}, {len(gpus)} GPU(s) {', '.join(names)}".strip()
    )


def _torch_info(probe: Probe) -> dict[str, Any] | None:
    out = probe.output("torch")
    if not out.ok:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def check_cuda_compat(probe: Probe) -> CheckResult:
    name = "torch CUDA vs driver"
    smi = probe.output("nvidia-smi")
    torch = _torch_info(probe)
    if torch is None:
        return skipped(name, "torch is not importable here (check inside the serving image)")
    if not smi.ok or "cuda" not in parse_nvidia_smi(smi.stdout):
        return skipped(name, "no driver CUDA version to compare against")
    built, driver = torch.get("cuda"), parse_nvidia_smi(smi.stdout)["cuda"]
    if not built:
        return failed(
            name,
            f"torch {torch.get('torch')} is a CPU-only build",
            "install a CUDA build of torch in the image (e.g. the cu124 wheel) matching the driver",
        )
    if _version(built)[0] > _version(driver)[0]:
        return failed(
            name,
            f"torch built for CUDA {built}, driver supports at most CUDA {driver}",
            f"upgrade the driver to one supporting CUDA {built}, "
            f"or install torch built for CUDA {driver.split('.')[0]}.x",
        )
    if _version(built) > _version(driver):
        return warned(
            name,
            f"torch built for CUDA {built}, driver supports CUDA {driver} (minor-version compatibility only)",
            f"works except PTX JIT and features newer than {driver}; upgrade the driver to one supporting CUDA {built}",
        )
    return passed(name, f"torch {torch.get('torch')} built for CUDA {built}, driver supports CUDA {driver}")


def check_torch_gpus(probe: Probe) -> CheckResult:
    name = "torch sees the GPUs"
    torch = _torch_info(probe)
    if torch is None:
        return skipped(name, "torch is not importable here (check inside the serving image)")
    gpus = parse_gpu_query(probe.output("nvidia-smi-query").stdout)
    if not torch.get("available"):
        return failed(
            name,
            "torch.cuda.is_available() is False",
            "check CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES, that the container runs with the nvidia runtime, "
            "and the driver/CUDA check above",
        )
    count = int(torch.get("device_count", 0))
    if gpus and count != len(gpus):
        return warned(
            name,
            f"torch sees {count} GPU(s), nvidia-smi lists {len(gpus)}",
            "CUDA_VISIBLE_DEVICES or the pod's nvidia.com/gpu limit hides some GPUs; that is expected inside a pod",
        )
    return passed(name, f"torch sees {count} GPU(s)")


def check_local_mig(probe: Probe) -> CheckResult:
    name = "MIG mode (this node)"
    out = probe.output("nvidia-smi-query")
    if not out.ok:
        return skipped(name, "no nvidia-smi query output")
    modes = {g["mig"] for g in parse_gpu_query(out.stdout)}
    if modes == {"Enabled", "Disabled"}:
        return warned(
            name,
            "some GPUs have MIG enabled and others not",
            "with migStrategy single the device plugin then advertises only one kind; use the mixed strategy "
            "or make every GPU on the node the same (`nvidia-smi -mig 0|1` per GPU)",
        )
    return passed(name, f"MIG {', '.join(sorted(modes)) or 'n/a'} on all GPUs")
