"""The container toolkit and device files (doctor/toolkit.py), from recordings with one thing broken."""

from __future__ import annotations

from .conftest import by_name


def test_missing_container_toolkit_fails_with_the_runtime_fix(recording):
    (recording / "nvidia-container-cli.txt").unlink()
    result = by_name(recording)["nvidia-container-cli"]
    assert result.status == "fail"
    assert "nvidia-ctk runtime configure" in result.fix


def test_device_files_closed_to_non_root_users_fail(recording):
    path = recording / "dev-nvidia.txt"
    path.write_text(path.read_text().replace("/dev/nvidia0 666", "/dev/nvidia0 660"))
    result = by_name(recording)["/dev/nvidia* permissions"]
    assert result.status == "fail"
    assert "/dev/nvidia0" in result.detail
    assert "NVreg_DeviceFileMode=0666" in result.fix


def test_missing_nvidia_uvm_fails(recording):
    path = recording / "dev-nvidia.txt"
    path.write_text("".join(line for line in path.read_text().splitlines(True) if "uvm" not in line))
    result = by_name(recording)["/dev/nvidia* permissions"]
    assert result.status == "fail"
    assert "nvidia-modprobe -u" in result.fix
