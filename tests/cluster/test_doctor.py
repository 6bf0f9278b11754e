"""doctor: every failure mode is found from recorded outputs, with its fix; a healthy recording passes.

The healthy recording (fixtures/doctor/good) was taken on a real H200 node; each test copies it and
breaks exactly one thing, the way that failure shows up on a real machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from railyard.cluster.doctor import format_report, run_checks
from railyard.cluster.probe import RecordedProbe

from .conftest import FIXTURES

GOOD = FIXTURES / "doctor" / "good"


@pytest.fixture
def recording(tmp_path) -> Path:
    target = tmp_path / "rec"
    shutil.copytree(GOOD, target)
    return target


def _by_name(directory: Path):
    return {r.name: r for r in run_checks(RecordedProbe(directory))}


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _gpu_nodes(data):
    return [n for n in data["items"] if "nvidia.com/gpu.product" in n["metadata"]["labels"]]


def test_the_healthy_recording_passes_every_check():
    results = run_checks(RecordedProbe(GOOD))
    assert [r.status for r in results] == ["pass"] * 11
    assert format_report(results).endswith("doctor: 11 ok, 0 failing, 0 warning, 0 skipped")


def test_the_real_h200_recording_reads_driver_cuda_and_gpu(recording):
    detail = _by_name(recording)["nvidia-smi"].detail
    assert detail == "driver 580.159.04, CUDA 13.0, 1 GPU(s) NVIDIA H200"


def test_missing_nvidia_smi_fails_with_the_driver_fix(recording):
    (recording / "nvidia-smi.txt").unlink()
    result = _by_name(recording)["nvidia-smi"]
    assert result.status == "fail"
    assert "install the NVIDIA datacenter driver" in result.fix


def test_nvidia_smi_that_cannot_reach_the_driver_fails(recording):
    (recording / "nvidia-smi.txt").write_text(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    (recording / "nvidia-smi.txt.rc").write_text("9")
    result = _by_name(recording)["nvidia-smi"]
    assert result.status == "fail"
    assert "couldn't communicate" in result.detail
    assert "dkms" in result.fix


def test_torch_built_for_a_newer_cuda_major_than_the_driver_fails(recording):
    smi = recording / "nvidia-smi.txt"
    smi.write_text(smi.read_text().replace("CUDA Version: 13.0", "CUDA Version: 12.4"))
    result = _by_name(recording)["torch CUDA vs driver"]
    assert result.status == "fail"
    assert result.detail == "torch built for CUDA 13.0, driver supports at most CUDA 12.4"
    assert "upgrade the driver" in result.fix


def test_torch_one_minor_ahead_of_the_driver_warns_about_minor_version_compatibility(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cu131", "cuda": "13.1", "available": true, "device_count": 1}\n'
    )
    result = _by_name(recording)["torch CUDA vs driver"]
    assert result.status == "warn"
    assert "minor-version compatibility" in result.detail


def test_a_cpu_only_torch_build_fails(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cpu", "cuda": null, "available": false, "device_count": 0}\n'
    )
    results = _by_name(recording)
    assert results["torch CUDA vs driver"].status == "fail"
    assert "CPU-only" in results["torch CUDA vs driver"].detail


def test_torch_that_cannot_see_the_gpus_fails(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cu130", "cuda": "13.0", "available": false, "device_count": 0}\n'
    )
    result = _by_name(recording)["torch sees the GPUs"]
    assert result.status == "fail"
    assert "nvidia runtime" in result.fix


def test_missing_container_toolkit_fails_with_the_runtime_fix(recording):
    (recording / "nvidia-container-cli.txt").unlink()
    result = _by_name(recording)["nvidia-container-cli"]
    assert result.status == "fail"
    assert "nvidia-ctk runtime configure" in result.fix


def test_device_files_closed_to_non_root_users_fail(recording):
    path = recording / "dev-nvidia.txt"
    path.write_text(path.read_text().replace("/dev/nvidia0 666", "/dev/nvidia0 660"))
    result = _by_name(recording)["/dev/nvidia* permissions"]
    assert result.status == "fail"
    assert "/dev/nvidia0" in result.detail
    assert "NVreg_DeviceFileMode=0666" in result.fix


def test_missing_nvidia_uvm_fails(recording):
    path = recording / "dev-nvidia.txt"
    path.write_text("".join(line for line in path.read_text().splitlines(True) if "uvm" not in line))
    result = _by_name(recording)["/dev/nvidia* permissions"]
    assert result.status == "fail"
    assert "nvidia-modprobe -u" in result.fix


def test_missing_device_plugin_daemonset_fails(recording):
    _edit_json(
        recording / "daemonsets.json",
        lambda d: d.update(items=[i for i in d["items"] if "device-plugin" not in i["metadata"]["name"]]),
    )
    result = _by_name(recording)["NVIDIA device plugin"]
    assert result.status == "fail"
    assert "helm install nvdp" in result.fix


def test_device_plugin_not_ready_on_every_node_fails(recording):
    def half_ready(data):
        for ds in data["items"]:
            if ds["metadata"]["name"] == "nvdp-nvidia-device-plugin":
                ds["status"]["numberReady"] = 1

    _edit_json(recording / "daemonsets.json", half_ready)
    result = _by_name(recording)["NVIDIA device plugin"]
    assert result.status == "fail"
    assert "1/2 ready" in result.detail


def test_gpu_node_without_gpu_capacity_fails(recording):
    def drop(data):
        node = _gpu_nodes(data)[0]
        del node["status"]["capacity"]["nvidia.com/gpu"]
        del node["status"]["allocatable"]["nvidia.com/gpu"]

    _edit_json(recording / "nodes.json", drop)
    result = _by_name(recording)["GPU capacity"]
    assert result.status == "fail"
    assert "ip-10-0-2-41.ec2.internal has no nvidia.com/gpu capacity" in result.detail


def test_gpu_node_with_capacity_but_nothing_allocatable_fails(recording):
    _edit_json(
        recording / "nodes.json", lambda d: _gpu_nodes(d)[1]["status"]["allocatable"].update({"nvidia.com/gpu": "0"})
    )
    result = _by_name(recording)["GPU capacity"]
    assert result.status == "fail"
    assert "capacity 8 but no allocatable" in result.detail


def test_unhealthy_gpus_reduce_allocatable_and_warn(recording):
    _edit_json(
        recording / "nodes.json", lambda d: _gpu_nodes(d)[1]["status"]["allocatable"].update({"nvidia.com/gpu": "7"})
    )
    result = _by_name(recording)["GPU capacity"]
    assert result.status == "warn"
    assert "allocatable 7 < capacity 8" in result.detail


def test_untainted_gpu_node_warns_with_the_taint_command(recording):
    _edit_json(recording / "nodes.json", lambda d: _gpu_nodes(d)[0]["spec"].pop("taints"))
    result = _by_name(recording)["GPU node taints"]
    assert result.status == "warn"
    assert "kubectl taint nodes ip-10-0-2-41.ec2.internal nvidia.com/gpu=present:NoSchedule" in result.fix


def test_mixed_mig_strategy_without_mig_resources_fails(recording):
    _edit_json(
        recording / "nodes.json",
        lambda d: _gpu_nodes(d)[0]["metadata"]["labels"].update({"nvidia.com/mig.strategy": "mixed"}),
    )
    result = _by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "strategy mixed but no nvidia.com/mig-* resources" in result.detail


def test_mig_devices_under_strategy_none_fail(recording):
    def mig(data):
        node = _gpu_nodes(data)[1]
        node["status"]["capacity"]["nvidia.com/mig-1g.18gb"] = "56"

    _edit_json(recording / "nodes.json", mig)
    result = _by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "strategy none but the node advertises nvidia.com/mig-1g.18gb" in result.detail


def test_single_strategy_on_whole_gpus_fails(recording):
    _edit_json(
        recording / "nodes.json",
        lambda d: [n["metadata"]["labels"].update({"nvidia.com/mig.strategy": "single"}) for n in _gpu_nodes(d)],
    )
    result = _by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "names no MIG profile" in result.detail


def test_gpus_with_mixed_mig_modes_on_one_node_warn(recording):
    (recording / "nvidia-smi-query.csv").write_text(
        "0, NVIDIA H200, 580.159.04, 143771 MiB, Enabled\n1, NVIDIA H200, 580.159.04, 143771 MiB, Disabled\n"
    )
    assert _by_name(recording)["MIG mode (this node)"].status == "warn"


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


def test_gpu_nodes_without_gfd_labels_fail_because_the_affinity_would_never_match(recording):
    def unlabel(data):
        labels = _gpu_nodes(data)[1]["metadata"]["labels"]
        for key in [k for k in labels if k.startswith("nvidia.com/")]:
            del labels[key]
    _edit_json(recording / "nodes.json", unlabel)
    result = _by_name(recording)["GPU Feature Discovery labels"]
    assert result.status == "fail"
    assert "ip-10-0-3-88.ec2.internal" in result.detail
    assert "gfd.enabled=true" in result.fix
