"""The NVIDIA device plugin: the DaemonSet that makes nodes advertise nvidia.com/gpu, ready everywhere."""

from __future__ import annotations

from railyard.cluster.doctor.kubectl import kubectl_items
from railyard.cluster.doctor.probe import Probe
from railyard.cluster.doctor.result import CheckResult, failed, passed


def check_device_plugin(probe: Probe) -> CheckResult:
    name = "NVIDIA device plugin"
    items = kubectl_items(probe, "daemonsets")
    if isinstance(items, CheckResult):
        return items
    # By name: GFD ships in the same k8s-device-plugin image, so the image alone cannot tell them apart.
    plugins = [
        ds
        for ds in items
        if "device-plugin" in ds.get("metadata", {}).get("name", "")
        and "feature-discovery" not in ds.get("metadata", {}).get("name", "")
    ]
    if not plugins:
        return failed(
            name,
            "no NVIDIA device plugin DaemonSet: nodes cannot advertise nvidia.com/gpu",
            "install it: `helm install nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin --create-namespace` "
            "(or the NVIDIA GPU Operator)",
        )
    bad = []
    for ds in plugins:
        status = ds.get("status", {})
        desired, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        if desired == 0 or ready < desired:
            meta = ds["metadata"]
            bad.append(f"{meta.get('namespace', '?')}/{meta['name']} {ready}/{desired} ready")
    if bad:
        return failed(
            name,
            f"device plugin not running everywhere: {'; '.join(bad)}",
            "`kubectl -n <namespace> describe ds <name>` and check its pods' logs; a plugin pod that cannot "
            "schedule usually lacks the nvidia.com/gpu toleration or the GPU node label",
        )
    ds = plugins[0]
    where = f"{ds['metadata'].get('namespace', '?')}/{ds['metadata']['name']}"
    return passed(name, f"{where} ready on {ds['status'].get('numberReady')} node(s)")
