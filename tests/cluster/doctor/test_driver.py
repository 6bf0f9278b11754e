"""This node's driver and CUDA (doctor/driver.py), from recordings of a real H200 node with one thing broken."""

from __future__ import annotations

from .conftest import by_name


def test_the_real_h200_recording_reads_driver_cuda_and_gpu(recording):
    detail = by_name(recording)["nvidia-smi"].detail
    assert detail == "driver 580.159.04, CUDA 13.0, 1 GPU(s) NVIDIA H200"


def test_missing_nvidia_smi_fails_with_the_driver_fix(recording):
    (recording / "nvidia-smi.txt").unlink()
    result = by_name(recording)["nvidia-smi"]
    assert result.status == "fail"
    assert "install the NVIDIA datacenter driver" in result.fix


def test_nvidia_smi_that_cannot_reach_the_driver_fails(recording):
    (recording / "nvidia-smi.txt").write_text(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    (recording / "nvidia-smi.txt.rc").write_text("9")
    result = by_name(recording)["nvidia-smi"]
    assert result.status == "fail"
    assert "couldn't communicate" in result.detail
    assert "dkms" in result.fix


def test_torch_built_for_a_newer_cuda_major_than_the_driver_fails(recording):
    smi = recording / "nvidia-smi.txt"
    smi.write_text(smi.read_text().replace("CUDA Version: 13.0", "CUDA Version: 12.4"))
    result = by_name(recording)["torch CUDA vs driver"]
    assert result.status == "fail"
    assert result.detail == "torch built for CUDA 13.0, driver supports at most CUDA 12.4"
    assert "upgrade the driver" in result.fix


def test_torch_one_minor_ahead_of_the_driver_warns_about_minor_version_compatibility(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cu131", "cuda": "13.1", "available": true, "device_count": 1}\n'
    )
    result = by_name(recording)["torch CUDA vs driver"]
    assert result.status == "warn"
    assert "minor-version compatibility" in result.detail


def test_a_cpu_only_torch_build_fails(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cpu", "cuda": null, "available": false, "device_count": 0}\n'
    )
    results = by_name(recording)
    assert results["torch CUDA vs driver"].status == "fail"
    assert "CPU-only" in results["torch CUDA vs driver"].detail


def test_torch_that_cannot_see_the_gpus_fails(recording):
    (recording / "torch.json").write_text(
        '{"torch": "2.11.0+cu130", "cuda": "13.0", "available": false, "device_count": 0}\n'
    )
    result = by_name(recording)["torch sees the GPUs"]
    assert result.status == "fail"
    assert "nvidia runtime" in result.fix


def test_gpus_with_mixed_mig_modes_on_one_node_warn(recording):
    (recording / "nvidia-smi-query.csv").write_text(
        "0, NVIDIA H200, 580.159.04, 143771 MiB, Enabled\n1, NVIDIA H200, 580.159.04, 143771 MiB, Disabled\n"
    )
    assert by_name(recording)["MIG mode (this node)"].status == "warn"
