"""The cluster's GPU nodes and labels (doctor/nodes.py), from recordings with one thing broken."""

from __future__ import annotations

from .conftest import by_name, edit_json, gpu_nodes


def test_gpu_node_without_gpu_capacity_fails(recording):
    def drop(data):
        node = gpu_nodes(data)[0]
        del node["status"]["capacity"]["nvidia.com/gpu"]
        del node["status"]["allocatable"]["nvidia.com/gpu"]

    edit_json(recording / "nodes.json", drop)
    result = by_name(recording)["GPU capacity"]
    assert result.status == "fail"
    assert "ip-10-0-2-41.ec2.internal has no nvidia.com/gpu capacity" in result.detail


def test_gpu_node_with_capacity_but_nothing_allocatable_fails(recording):
    edit_json(
        recording / "nodes.json", lambda d: gpu_nodes(d)[1]["status"]["allocatable"].update({"nvidia.com/gpu": "0"})
    )
    result = by_name(recording)["GPU capacity"]
    assert result.status == "fail"
    assert "capacity 8 but no allocatable" in result.detail


def test_unhealthy_gpus_reduce_allocatable_and_warn(recording):
    edit_json(
        recording / "nodes.json", lambda d: gpu_nodes(d)[1]["status"]["allocatable"].update({"nvidia.com/gpu": "7"})
    )
    result = by_name(recording)["GPU capacity"]
    assert result.status == "warn"
    assert "allocatable 7 < capacity 8" in result.detail


def test_untainted_gpu_node_warns_with_the_taint_command(recording):
    edit_json(recording / "nodes.json", lambda d: gpu_nodes(d)[0]["spec"].pop("taints"))
    result = by_name(recording)["GPU node taints"]
    assert result.status == "warn"
    assert "kubectl taint nodes ip-10-0-2-41.ec2.internal nvidia.com/gpu=present:NoSchedule" in result.fix


def test_mixed_mig_strategy_without_mig_resources_fails(recording):
    edit_json(
        recording / "nodes.json",
        lambda d: gpu_nodes(d)[0]["metadata"]["labels"].update({"nvidia.com/mig.strategy": "mixed"}),
    )
    result = by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "strategy mixed but no nvidia.com/mig-* resources" in result.detail


def test_mig_devices_under_strategy_none_fail(recording):
    def mig(data):
        node = gpu_nodes(data)[1]
        node["status"]["capacity"]["nvidia.com/mig-1g.18gb"] = "56"

    edit_json(recording / "nodes.json", mig)
    result = by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "strategy none but the node advertises nvidia.com/mig-1g.18gb" in result.detail


def test_single_strategy_on_whole_gpus_fails(recording):
    edit_json(
        recording / "nodes.json",
        lambda d: [n["metadata"]["labels"].update({"nvidia.com/mig.strategy": "single"}) for n in gpu_nodes(d)],
    )
    result = by_name(recording)["MIG strategy"]
    assert result.status == "fail"
    assert "names no MIG profile" in result.detail


def test_gpu_nodes_without_gfd_labels_fail_because_the_affinity_would_never_match(recording):
    def unlabel(data):
        labels = gpu_nodes(data)[1]["metadata"]["labels"]
        for key in [k for k in labels if k.startswith("nvidia.com/")]:
            del labels[key]
    edit_json(recording / "nodes.json", unlabel)
    result = by_name(recording)["GPU Feature Discovery labels"]
    assert result.status == "fail"
    assert "ip-10-0-3-88.ec2.internal" in result.detail
    assert "gfd.enabled=true" in result.fix
