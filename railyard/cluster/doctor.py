"""Preflight of the GPU stack a replica depends on, bottom up: driver, CUDA, torch, container toolkit,
device files, then the cluster's device plugin, GPU capacity, taints and MIG strategy.

Each check passes, warns or fails, and every warning or failure carries the fix. Checks only read
outputs through a Probe (see probe.py), so each failure mode is testable from recorded outputs.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable

from railyard.cluster.probe import Output, Probe

GPU = "nvidia.com/gpu"
_DEVICE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: status is pass, warn, fail or skip; fix says what to do when not pass."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _pass(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "pass", detail)


def _fail(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, "fail", detail, fix)


def _warn(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, "warn", detail, fix)


def _skip(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "skip", detail)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


# ---- node checks -------------------------------------------------------------------------------


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
        return _fail(
            name,
            "nvidia-smi not found: no NVIDIA driver on this node",
            "install the NVIDIA datacenter driver (or let the GPU Operator's driver DaemonSet do it), then re-run",
        )
    if not out.ok:
        said = (out.stderr or out.stdout).strip()
        return _fail(
            name,
            f"nvidia-smi failed: {said.splitlines()[0] if said else f'exit {out.returncode}'}",
            "the driver is installed but not loaded: check `dmesg | grep -i nvrm`, rebuild the module for the "
            "running kernel (dkms) or reboot after the driver install",
        )
    info = parse_nvidia_smi(out.stdout)
    if "driver" not in info:
        return _warn(
            name, "could not read the driver version from nvidia-smi", "run `nvidia-smi` by hand and check its header"
        )
    gpus = parse_gpu_query(probe.output("nvidia-smi-query").stdout)
    names = sorted({g["name"] for g in gpus})
    return _pass(
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
        return _skip(name, "torch is not importable here (check inside the serving image)")
    if not smi.ok or "cuda" not in parse_nvidia_smi(smi.stdout):
        return _skip(name, "no driver CUDA version to compare against")
    built, driver = torch.get("cuda"), parse_nvidia_smi(smi.stdout)["cuda"]
    if not built:
        return _fail(
            name,
            f"torch {torch.get('torch')} is a CPU-only build",
            "install a CUDA build of torch in the image (e.g. the cu124 wheel) matching the driver",
        )
    if _version(built)[0] > _version(driver)[0]:
        return _fail(
            name,
            f"torch built for CUDA {built}, driver supports at most CUDA {driver}",
            f"upgrade the driver to one supporting CUDA {built}, "
            f"or install torch built for CUDA {driver.split('.')[0]}.x",
        )
    if _version(built) > _version(driver):
        return _warn(
            name,
            f"torch built for CUDA {built}, driver supports CUDA {driver} (minor-version compatibility only)",
            f"works except PTX JIT and features newer than {driver}; upgrade the driver to one supporting CUDA {built}",
        )
    return _pass(name, f"torch {torch.get('torch')} built for CUDA {built}, driver supports CUDA {driver}")


def check_torch_gpus(probe: Probe) -> CheckResult:
    name = "torch sees the GPUs"
    torch = _torch_info(probe)
    if torch is None:
        return _skip(name, "torch is not importable here (check inside the serving image)")
    gpus = parse_gpu_query(probe.output("nvidia-smi-query").stdout)
    if not torch.get("available"):
        return _fail(
            name,
            "torch.cuda.is_available() is False",
            "check CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES, that the container runs with the nvidia runtime, "
            "and the driver/CUDA check above",
        )
    count = int(torch.get("device_count", 0))
    if gpus and count != len(gpus):
        return _warn(
            name,
            f"torch sees {count} GPU(s), nvidia-smi lists {len(gpus)}",
            "CUDA_VISIBLE_DEVICES or the pod's nvidia.com/gpu limit hides some GPUs; that is expected inside a pod",
        )
    return _pass(name, f"torch sees {count} GPU(s)")


def check_container_toolkit(probe: Probe) -> CheckResult:
    name = "nvidia-container-cli"
    out = probe.output("nvidia-container-cli")
    if not out.found:
        return _fail(
            name,
            "nvidia-container-cli not found: containers cannot be given GPUs",
            "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=containerd` "
            "and restart containerd",
        )
    if not out.ok:
        return _fail(
            name, f"nvidia-container-cli failed: {out.stderr.strip()[:200]}", "reinstall nvidia-container-toolkit"
        )
    version = re.search(r"cli-version:\s*([\w.\-]+)|version\s+([\d.]+)", out.stdout)
    found = next((g for g in version.groups() if g), "?") if version else "?"
    return _pass(name, f"nvidia-container-cli {found}")


def check_device_files(probe: Probe) -> CheckResult:
    name = "/dev/nvidia* permissions"
    out = probe.output("dev-nvidia")
    lines = [line.split() for line in out.stdout.strip().splitlines() if line.strip()]
    if not out.ok or not lines:
        return _fail(
            name,
            "no /dev/nvidia* device files",
            "the driver's device nodes are missing: run `nvidia-modprobe -c 0 -u` (or load nvidia and nvidia-uvm)",
        )
    # Only the character devices matter; /dev/nvidia-caps is a directory (0755 is right for it).
    paths = {p[0]: p[1] for p in lines if len(p) >= 2 and _DEVICE.match(p[0])}
    missing = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm") if p not in paths]
    if missing:
        return _fail(
            name,
            f"missing {', '.join(missing)}",
            "load the nvidia-uvm module: `nvidia-modprobe -u -c=0` (CUDA needs /dev/nvidia-uvm)",
        )
    closed = [p for p, mode in paths.items() if len(mode) >= 3 and int(mode[-1]) & 6 != 6]
    if closed:
        return _fail(
            name,
            f"not readable and writable by other users (non-root pods): {', '.join(sorted(closed))}",
            "set `options nvidia NVreg_DeviceFileMode=0666` in /etc/modprobe.d/nvidia.conf and reload the driver",
        )
    return _pass(name, f"{len(paths)} device files, mode rw for all")


# ---- cluster checks ----------------------------------------------------------------------------


def _items(probe: Probe, name: str) -> list[dict[str, Any]] | CheckResult:
    out = probe.output(name)
    if not out.found:
        return _skip(f"kubectl get {name}", "kubectl not found: cluster checks skipped")
    if not out.ok:
        first = (out.stderr.strip().splitlines() or ["no output"])[0]
        return _fail(
            f"kubectl get {name}",
            f"kubectl failed: {first}",
            "check the kubeconfig context and your RBAC (get nodes, daemonsets)",
        )
    try:
        return json.loads(out.stdout).get("items", [])
    except ValueError:
        return _fail(f"kubectl get {name}", "kubectl did not print JSON", "re-run with `-o json`")


def is_gpu_node(node: dict[str, Any]) -> bool:
    """A node with NVIDIA hardware by GFD/NFD labels, or one that advertises GPUs."""
    labels = node.get("metadata", {}).get("labels", {}) or {}
    capacity = node.get("status", {}).get("capacity", {}) or {}
    return (
        labels.get("nvidia.com/gpu.present") == "true"
        or "nvidia.com/gpu.product" in labels
        or "nvidia.com/gpu.count" in labels
        or any(k == GPU or k.startswith("nvidia.com/mig-") for k in capacity)
    )


def _node_name(node: dict[str, Any]) -> str:
    return node.get("metadata", {}).get("name", "?")


def check_device_plugin(probe: Probe) -> CheckResult:
    name = "NVIDIA device plugin"
    items = _items(probe, "daemonsets")
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
        return _fail(
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
        return _fail(
            name,
            f"device plugin not running everywhere: {'; '.join(bad)}",
            "`kubectl -n <namespace> describe ds <name>` and check its pods' logs; a plugin pod that cannot "
            "schedule usually lacks the nvidia.com/gpu toleration or the GPU node label",
        )
    ds = plugins[0]
    where = f"{ds['metadata'].get('namespace', '?')}/{ds['metadata']['name']}"
    return _pass(name, f"{where} ready on {ds['status'].get('numberReady')} node(s)")


def _gpu_nodes(probe: Probe) -> list[dict[str, Any]] | CheckResult:
    items = _items(probe, "nodes")
    if isinstance(items, CheckResult):
        return items
    return [n for n in items if is_gpu_node(n)]


def check_gpu_capacity(probe: Probe) -> CheckResult:
    name = "GPU capacity"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    if not nodes:
        return _fail(
            name,
            "no GPU nodes found (no GFD labels, no nvidia.com/gpu capacity)",
            "add GPU nodes and deploy GPU Feature Discovery",
        )
    problems, degraded = [], []
    for node in nodes:
        status = node.get("status", {})
        cap, alloc = status.get("capacity", {}).get(GPU), status.get("allocatable", {}).get(GPU)
        mig = [k for k in status.get("capacity", {}) if k.startswith("nvidia.com/mig-")]
        if mig and not cap:
            continue  # mixed MIG strategy advertises mig-* resources instead; the MIG check covers it
        if not cap or int(cap) == 0:
            problems.append(f"{_node_name(node)} has no nvidia.com/gpu capacity")
        elif not alloc or int(alloc) == 0:
            problems.append(f"{_node_name(node)} has capacity {cap} but no allocatable nvidia.com/gpu")
        elif int(alloc) < int(cap):
            degraded.append(f"{_node_name(node)} allocatable {alloc} < capacity {cap}")
        label = node.get("metadata", {}).get("labels", {}).get("nvidia.com/gpu.count")
        if cap and label and int(label) != int(cap) and not mig:
            degraded.append(f"{_node_name(node)} reports {cap} nvidia.com/gpu but GFD counts {label} GPUs")
    if problems:
        return _fail(
            name,
            "; ".join(problems),
            "the device plugin is not advertising GPUs on these nodes: check its pod there "
            "(`kubectl -n <ns> get pods -o wide | grep device-plugin`) and its log for NVML errors",
        )
    if degraded:
        return _warn(
            name,
            "; ".join(degraded),
            "the device plugin marked GPUs unhealthy (XID errors) or a GPU fell off the bus: check `nvidia-smi -q` "
            "and `dmesg` on the node, drain and reset it",
        )
    total = sum(int(n["status"]["allocatable"].get(GPU, 0)) for n in nodes)
    return _pass(name, f"{len(nodes)} GPU node(s), {total} allocatable nvidia.com/gpu")


def check_gfd_labels(probe: Probe) -> CheckResult:
    name = "GPU Feature Discovery labels"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    wanted = ("nvidia.com/gpu.product", "nvidia.com/gpu.count")
    unlabelled = [
        _node_name(n) for n in nodes if any(k not in (n.get("metadata", {}).get("labels") or {}) for k in wanted)
    ]
    if unlabelled:
        return _fail(
            name,
            f"GPU nodes without {' / '.join(wanted)}: {', '.join(unlabelled)}; "
            "railyard's GPU node affinity selects on them, so its pods would stay Pending",
            "deploy GPU Feature Discovery (NVIDIA device plugin chart with `--set gfd.enabled=true`, or the "
            "GPU Operator), or render with policies.gpu_node_affinity: false",
        )
    products = sorted({n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes})
    return _pass(name, f"all {len(nodes)} GPU node(s) labelled; products: {', '.join(products)}")


def _tolerable_gpu_taint(taint: dict[str, Any]) -> bool:
    return taint.get("key") == GPU and taint.get("effect") == "NoSchedule"


def check_gpu_taints(probe: Probe) -> CheckResult:
    name = "GPU node taints"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    untainted = [
        _node_name(n)
        for n in nodes
        if not any(_tolerable_gpu_taint(t) for t in n.get("spec", {}).get("taints", []) or [])
    ]
    if untainted:
        return _warn(
            name,
            f"GPU nodes without the nvidia.com/gpu:NoSchedule taint: {', '.join(untainted)}",
            "CPU-only pods can fill these nodes and strand their GPUs: "
            + " && ".join(f"kubectl taint nodes {n} nvidia.com/gpu=present:NoSchedule" for n in untainted[:3]),
        )
    return _pass(name, f"all {len(nodes)} GPU node(s) tainted nvidia.com/gpu:NoSchedule")


def check_mig(probe: Probe) -> CheckResult:
    name = "MIG strategy"
    nodes = _gpu_nodes(probe)
    if isinstance(nodes, CheckResult):
        return nodes
    strategies: dict[str, list[str]] = {}
    problems = []
    for node in nodes:
        labels = node.get("metadata", {}).get("labels", {}) or {}
        capacity = node.get("status", {}).get("capacity", {}) or {}
        strategy = labels.get("nvidia.com/mig.strategy", "none")
        strategies.setdefault(strategy, []).append(_node_name(node))
        mig = sorted(k for k in capacity if k.startswith("nvidia.com/mig-"))
        product = labels.get("nvidia.com/gpu.product", "")
        if strategy == "mixed" and not mig:
            problems.append(
                f"{_node_name(node)}: strategy mixed but no nvidia.com/mig-* resources (MIG disabled on its GPUs?)"
            )
        if strategy in ("none", "single") and mig:
            problems.append(f"{_node_name(node)}: strategy {strategy} but the node advertises {', '.join(mig)}")
        if strategy == "single" and "-MIG-" not in product:
            problems.append(
                f"{_node_name(node)}: strategy single but gpu.product {product!r} names no MIG profile (MIG disabled?)"
            )
        if strategy == "none" and "-MIG-" in product:
            problems.append(f"{_node_name(node)}: strategy none but gpu.product {product!r} is a MIG device")
    if problems:
        return _fail(
            name,
            "; ".join(problems),
            "make the device plugin's and GFD's MIG_STRATEGY match how the GPUs are partitioned "
            "(`nvidia-smi -L`), e.g. helm `--set migStrategy=none` for whole GPUs, and re-apply the MIG config",
        )
    if len(strategies) > 1:
        detail = "; ".join(f"{s}: {', '.join(ns)}" for s, ns in sorted(strategies.items()))
        return _warn(
            name,
            f"nodes disagree on the MIG strategy ({detail})",
            "one strategy per node pool is fine; make sure each model's gpu_product selects the pool it was sized for",
        )
    return _pass(
        name, f"strategy {next(iter(strategies), 'none')} on all GPU nodes, consistent with what they advertise"
    )


def check_local_mig(probe: Probe) -> CheckResult:
    name = "MIG mode (this node)"
    out = probe.output("nvidia-smi-query")
    if not out.ok:
        return _skip(name, "no nvidia-smi query output")
    modes = {g["mig"] for g in parse_gpu_query(out.stdout)}
    if modes == {"Enabled", "Disabled"}:
        return _warn(
            name,
            "some GPUs have MIG enabled and others not",
            "with migStrategy single the device plugin then advertises only one kind; use the mixed strategy "
            "or make every GPU on the node the same (`nvidia-smi -mig 0|1` per GPU)",
        )
    return _pass(name, f"MIG {', '.join(sorted(modes)) or 'n/a'} on all GPUs")


NODE_CHECKS: tuple[Callable[[Probe], CheckResult], ...] = (
    check_nvidia_smi,
    check_cuda_compat,
    check_torch_gpus,
    check_container_toolkit,
    check_device_files,
    check_local_mig,
)
CLUSTER_CHECKS: tuple[Callable[[Probe], CheckResult], ...] = (
    check_device_plugin,
    check_gpu_capacity,
    check_gfd_labels,
    check_gpu_taints,
    check_mig,
)


def run_checks(probe: Probe, node: bool = True, cluster: bool = True) -> list[CheckResult]:
    """Run the node and/or cluster checks; a cluster check that kubectl cannot answer is skipped once."""
    results = [check(probe) for check in NODE_CHECKS] if node else []
    if cluster:
        seen_skip = False
        for check in CLUSTER_CHECKS:
            result = check(probe)
            if result.name.startswith("kubectl get"):
                if seen_skip:
                    continue
                seen_skip = True
            results.append(result)
    return results


def format_report(results: list[CheckResult]) -> str:
    """One line per check, its fix indented under it, and a closing count."""
    marks = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
    lines = []
    for r in results:
        lines.append(f"[{marks[r.status]}] {r.name}: {r.detail}")
        if r.fix and r.status in ("warn", "fail"):
            lines.append(f"       fix: {r.fix}")
    counts = {s: sum(r.status == s for r in results) for s in marks}
    lines.append(
        f"doctor: {counts['pass']} ok, {counts['fail']} failing, {counts['warn']} warning, {counts['skip']} skipped"
    )
    return "\n".join(lines)


__all__ = ["CheckResult", "Output", "run_checks", "format_report"]
