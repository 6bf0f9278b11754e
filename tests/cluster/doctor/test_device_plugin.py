"""The NVIDIA device plugin DaemonSet (doctor/device_plugin.py), from recordings with one thing broken."""

from __future__ import annotations

from .conftest import by_name, edit_json


def test_missing_device_plugin_daemonset_fails(recording):
    edit_json(
        recording / "daemonsets.json",
        lambda d: d.update(items=[i for i in d["items"] if "device-plugin" not in i["metadata"]["name"]]),
    )
    result = by_name(recording)["NVIDIA device plugin"]
    assert result.status == "fail"
    assert "helm install nvdp" in result.fix


def test_device_plugin_not_ready_on_every_node_fails(recording):
    def half_ready(data):
        for ds in data["items"]:
            if ds["metadata"]["name"] == "nvdp-nvidia-device-plugin":
                ds["status"]["numberReady"] = 1

    edit_json(recording / "daemonsets.json", half_ready)
    result = by_name(recording)["NVIDIA device plugin"]
    assert result.status == "fail"
    assert "1/2 ready" in result.detail
