"""kube-scheduler simulation: scenarios with known answers, in kube-scheduler's own words.

The expected messages are kube-scheduler's: FitError "0/N nodes are available: <sorted count reason, ...>."
with the filter plugins' reason strings (NodeResourcesFit "Insufficient <resource>", TaintToleration
"node(s) had untolerated taint {key: value}", NodeAffinity "node(s) didn't match Pod's node affinity/selector",
InterPodAffinity "node(s) didn't match pod anti-affinity rules", PodTopologySpread
"node(s) didn't match pod topology spread constraints").
"""

from __future__ import annotations

from railyard.cluster.nodes import parse_nodes
from railyard.cluster.plan import plan
from railyard.cluster.scheduler import KubeScheduler, fit_error, nodes_to_find
from railyard.cluster.workload import PodSpec, Term, pods_from_objects
from railyard.cluster.render import render

from .conftest import ONE_GPU, TP2, TWO_MODELS, make_stack


def gpu_nodes(n, gpus=1, product="NVIDIA-H200", **extra):
    return [
        {
            "name": f"gpu-{i}",
            "gpu": {"product": product, "count": gpus, "memory_mib": 143771},
            "allocatable": {"cpu": "64", "memory": "512Gi"},
            **extra,
        }
        for i in range(n)
    ]


CPU_NODE = {"name": "cpu-0", "allocatable": {"cpu": "16", "memory": "64Gi"}}


def nodes(*entries):
    return parse_nodes({"nodes": list(entries)})


def test_insufficient_gpus_reads_like_kube_scheduler():
    stack = make_stack(ONE_GPU, models=[{"name": "qwen2-7b", "model": "/m", "num_replicas": 5}])
    result = plan(stack, nodes(*gpu_nodes(4)), mode="deployment")
    assert sorted(p.node for p in result.pods[:4]) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert result.pods[4].node is None
    assert result.pods[4].message == "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert "add GPU nodes or lower num_replicas" in result.hints[result.pods[4].pod.name]


def test_reasons_from_different_nodes_are_counted_and_sorted():
    stack = make_stack(ONE_GPU, models=[{"name": "qwen2-7b", "model": "/m", "num_replicas": 5}])
    result = plan(stack, nodes(CPU_NODE, *gpu_nodes(4)), mode="deployment")
    assert result.pods[4].message == (
        "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu."
    )


def test_untolerated_gpu_taint():
    stack = make_stack(ONE_GPU, policies={"gpu_toleration": False})
    tainted = [dict(n, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]) for n in gpu_nodes(2)]
    for n in tainted:
        n["gpu"] = dict(n["gpu"], tainted=False)
    result = plan(stack, nodes(*tainted), mode="deployment")
    assert [p.message for p in result.pods] == [
        "0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: }."
    ] * 2
    assert "gpu_toleration" in result.hints[result.pods[0].pod.name]


def test_the_gpu_toleration_lets_the_same_pods_onto_the_tainted_nodes():
    result = plan(make_stack(ONE_GPU), nodes(*gpu_nodes(2)), mode="deployment")
    assert sorted(p.node for p in result.pods) == ["gpu-0", "gpu-1"]


def test_gpu_product_affinity_mismatch_names_the_products_present():
    result = plan(make_stack(ONE_GPU), nodes(*gpu_nodes(2, product="NVIDIA-A100-SXM4-80GB")), mode="deployment")
    assert result.pods[0].message == "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    assert result.hints[result.pods[0].pod.name] == (
        "no node has nvidia.com/gpu.product in ['NVIDIA-H200']; products here: ['NVIDIA-A100-SXM4-80GB']"
    )


def test_without_the_affinity_policy_any_gpu_product_is_taken():
    stack = make_stack(ONE_GPU, policies={"gpu_node_affinity": False})
    result = plan(stack, nodes(*gpu_nodes(2, product="NVIDIA-A100-SXM4-80GB")), mode="deployment")
    assert all(p.node for p in result.pods)


def test_required_anti_affinity_allows_one_replica_per_node():
    stack = make_stack(
        ONE_GPU, models=[{"name": "m", "model": "/m", "num_replicas": 3}], policies={"spread": "required"}
    )
    result = plan(stack, nodes(*gpu_nodes(2, gpus=8)), mode="deployment")
    assert sorted(p.node for p in result.pods[:2]) == ["gpu-0", "gpu-1"]
    assert result.pods[2].message == "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."


def test_preferred_anti_affinity_outweighs_least_allocated_and_spreads_replicas():
    # LeastAllocated alone keeps both replicas on the roomy node; the anti-affinity preference moves the
    # second one to the small node: InterPodAffinity (weight 2, normalized 0..100) beats the 55-point gap.
    big = {
        "name": "big",
        "gpu": {"product": "NVIDIA-H200", "count": 8},
        "allocatable": {"cpu": "190", "memory": "2000Gi"},
    }
    small = {
        "name": "small",
        "gpu": {"product": "NVIDIA-H200", "count": 8},
        "allocatable": {"cpu": "20", "memory": "100Gi"},
    }
    model = {"name": "m", "model": "/m", "num_replicas": 2, "resources": {"cpu": "8", "memory": "64Gi"}}
    spread = plan(make_stack(ONE_GPU, models=[model]), nodes(big, small), mode="deployment")
    packed = plan(make_stack(ONE_GPU, models=[model], policies={"spread": "off"}), nodes(big, small), mode="deployment")
    assert [p.node for p in spread.pods] == ["big", "small"]
    assert [p.node for p in packed.pods] == ["big", "big"]


def test_hard_topology_spread_rejects_the_crowded_zone():
    def pod(i):
        zone_spread = Term(frozenset({("app", "x")}), "topology.kubernetes.io/zone", max_skew=1)
        return PodSpec(f"p{i}", "g", {"app": "x"}, {"cpu": 1000}, spread_hard=[zone_spread])

    cluster = nodes(
        {"name": "a", "labels": {"topology.kubernetes.io/zone": "z1"}, "allocatable": {"cpu": "1"}},
        {"name": "b", "labels": {"topology.kubernetes.io/zone": "z1"}, "allocatable": {"cpu": "8"}},
        {"name": "c", "labels": {"topology.kubernetes.io/zone": "z2"}, "allocatable": {"cpu": "1"}},
    )
    placements = KubeScheduler(cluster).schedule_all([pod(i) for i in range(4)])
    # b (most free cpu), then c (z1 would be 2 ahead of z2), then b again (zones even), then nothing:
    # a and b would put z1 two ahead, c is full.
    assert [p.node for p in placements[:3]] == ["b", "c", "b"]
    assert placements[3].message == (
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match pod topology spread constraints."
    )


def test_tp_replica_that_no_single_node_can_hold_is_pending_in_both_layers():
    tp8 = {"name": "big", "model": "/m", "tensor_parallel_size": 8, "num_replicas": 1}
    stack = make_stack(TP2, models=[tp8], policies={"gpu_node_affinity": False})
    result = plan(stack, nodes(CPU_NODE, *gpu_nodes(2, gpus=4)))
    worker = result.pods[1]
    # The CPU node lacks memory too (the head took 8Gi of its 64Gi): every insufficient resource counts.
    assert worker.message == "0/3 nodes are available: 1 Insufficient memory, 3 Insufficient nvidia.com/gpu."
    assert "largest node has 4 allocatable nvidia.com/gpu" in result.hints[worker.pod.name]
    (replica,) = result.replicas
    assert replica.node is None
    assert "placement group STRICT_PACK 8 x {GPU: 1, CPU: 1} fits no Ray node" in replica.message


def test_tp_replica_blocked_by_the_gfd_gpu_count_affinity_first():
    tp8 = {"name": "big", "model": "/m", "tensor_parallel_size": 8, "num_replicas": 1}
    result = plan(make_stack(TP2, models=[tp8]), nodes(CPU_NODE, *gpu_nodes(2, gpus=4)))
    assert result.pods[1].message == "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    assert "the largest matching node has 4 (nvidia.com/gpu.count)" in result.hints[result.pods[1].pod.name]


def test_tp2_replicas_each_take_two_gpus_of_one_node():
    result = plan(make_stack(TP2), nodes(CPU_NODE, *gpu_nodes(1, gpus=4)))
    assert [p.node for p in result.pods] == ["cpu-0", "gpu-0", "gpu-0"]
    assert [(r.replica.gpus, r.node) for r in result.replicas] == [(2, "gpu-0"), (2, "gpu-0")]


def test_mixed_a100_and_l40s_pools_each_model_lands_on_its_product():
    inventory = nodes(
        CPU_NODE,
        {
            "name": "l40s",
            "count": 2,
            "gpu": {"product": "NVIDIA-L40S", "count": 4, "memory_mib": 46068},
            "allocatable": {"cpu": "64", "memory": "512Gi"},
        },
        {
            "name": "a100",
            "gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 8, "memory_mib": 81920},
            "allocatable": {"cpu": "128", "memory": "1024Gi"},
        },
    )
    result = plan(make_stack(TWO_MODELS), inventory)
    where = {p.pod.group: p.node for p in result.pods}
    assert where["head"] == "cpu-0"
    assert {where["engine-qwen2-7b-short"], where["engine-qwen2-7b-long"]} <= {"l40s-0", "l40s-1"}
    assert where["engine-llama3-8b-default"] == "a100"
    assert result.all_placed
    sizing = {s.deployment: s for s in result.sizing}
    assert sizing["engine-qwen2-7b-short"].kv.gpu_memory_bytes == 46068 * 1024**2
    assert sizing["engine-llama3-8b-default"].kv.gpu_memory_bytes == 81920 * 1024**2


def test_cpu_only_head_never_lands_on_a_tainted_gpu_node():
    result = plan(make_stack(ONE_GPU), nodes(*gpu_nodes(2, gpus=8)))
    head = result.pods[0]
    assert head.pod.group == "head"
    assert head.message == "0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: present}."
    assert all(r.message.startswith("Ray head pod is Pending") for r in result.replicas)


def test_plans_from_kubectl_get_nodes_json(tmp_path):
    from .conftest import FIXTURES
    from railyard.cluster.nodes import load_nodes

    cluster = load_nodes(FIXTURES / "doctor" / "good" / "nodes.json")
    assert [n.allocatable.get("nvidia.com/gpu", 0) for n in cluster] == [0, 8, 8]
    result = plan(make_stack(ONE_GPU), cluster)
    assert result.all_placed
    assert result.pods[0].node == "ip-10-0-1-17.ec2.internal"


def test_least_allocated_prefers_the_emptier_node():
    used = {
        "name": "used",
        "gpu": {"count": 8},
        "allocatable": {"cpu": "64", "memory": "512Gi"},
        "used": {"cpu": "32", "memory": "256Gi"},
    }
    free = {"name": "free", "gpu": {"count": 8}, "allocatable": {"cpu": "64", "memory": "512Gi"}}
    stack = make_stack(ONE_GPU, gpu_product=None, models=[{"name": "m", "model": "/m", "num_replicas": 1}])
    assert plan(stack, nodes(used, free), mode="deployment").pods[0].node == "free"


def test_percentage_of_nodes_to_score_follows_the_adaptive_default():
    assert nodes_to_find(50) == 50
    assert nodes_to_find(1000) == 420  # 50 - 1000/125 = 42%
    assert nodes_to_find(5000) == 500  # 10%
    assert nodes_to_find(200) == 100  # never fewer than 100


def test_fit_error_sorts_the_count_reason_strings():
    assert fit_error(4, {"Insufficient nvidia.com/gpu": 3, "node(s) were unschedulable": 1}) == (
        "0/4 nodes are available: 1 node(s) were unschedulable, 3 Insufficient nvidia.com/gpu."
    )


def test_cordoned_nodes_are_unschedulable():
    cordoned = [dict(n, unschedulable=True) for n in gpu_nodes(2)]
    result = plan(make_stack(ONE_GPU), nodes(*cordoned), mode="deployment")
    assert result.pods[0].message == "0/2 nodes are available: 2 node(s) were unschedulable."


def test_pods_come_from_the_rendered_manifests():
    pods = pods_from_objects(render(make_stack(TP2), "rayservice"))
    assert [p.group for p in pods] == ["head", "engine-llama3-8b-default", "engine-llama3-8b-default"]
    assert pods[1].requests["nvidia.com/gpu"] == 2
    assert pods[1].requests["cpu"] == 8000  # millicores


def test_the_planner_benchmark_runs_and_reports_json_fields():
    from railyard.cluster.plan_bench import run

    result = run(nodes=120, pods=200)
    assert (result["nodes"], result["pods"]) == (120, 200)
    assert result["scheduled"] + result["pending"] == 200
    assert result["scheduled"] == 200  # 108 GPU nodes x 8 GPUs hold the 395 GPUs asked for


def test_a_gpu_only_cluster_strands_the_ray_head_with_a_hint():
    result = plan(make_stack(ONE_GPU), nodes(*gpu_nodes(1)))
    assert "add an untainted CPU node" in result.hints[result.pods[0].pod.name]


def test_running_pods_from_kubectl_are_charged_to_their_nodes():
    from railyard.cluster.nodes import load_nodes, load_pods_into

    from .conftest import FIXTURES

    good = FIXTURES / "doctor" / "good"
    cluster = load_nodes(good / "nodes.json")
    assert load_pods_into(cluster, good / "pods.json") == 3  # the Succeeded pod holds nothing
    busy, idle = cluster[1], cluster[2]
    assert busy.requested["nvidia.com/gpu"] == 6
    assert idle.requested["cpu"] == 200  # max(sum of containers 100m, init container 200m)
    stack = make_stack(ONE_GPU, models=[{"name": "m", "model": "/m", "num_replicas": 10}])
    result = plan(stack, cluster)
    assert sum(1 for p in result.pods if p.node == busy.name) == 2  # 8 GPUs - 6 in use
    assert sum(1 for p in result.pods if p.node is None) == 0


def test_planning_leaves_the_callers_nodes_untouched():
    cluster = nodes(CPU_NODE, *gpu_nodes(2))
    plan(make_stack(ONE_GPU), cluster)
    assert all(n.requested == {} and n.pods == 0 for n in cluster)
