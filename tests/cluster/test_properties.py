"""Properties over generated stacks and clusters: any valid stack renders valid manifests, and the
scheduler never over-commits a node nor places a pod where a filter forbids it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.cluster.nodes import parse_nodes
from railyard.cluster.render import render
from railyard.cluster.scheduler import KubeScheduler, static_reason
from railyard.cluster.validate import validate_objects
from railyard.cluster.workload import pods_from_objects
from railyard.stack import parse_stack

PRODUCTS = ["NVIDIA-H200", "NVIDIA-L40S"]
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

model = st.fixed_dictionaries(
    {
        "model": st.just("/models/m"),
        "tensor_parallel_size": st.sampled_from([1, 2, 4]),
        "num_replicas": st.integers(0, 3),
        "gpu_product": st.sampled_from(PRODUCTS),
        "resources": st.fixed_dictionaries(
            {"cpu": st.sampled_from(["4", "8", "16"]), "memory": st.sampled_from(["32Gi", "64Gi"])}
        ),
    }
)
policies = st.fixed_dictionaries(
    {
        name: st.booleans()
        for name in (
            "gpu_limits",
            "gpu_toleration",
            "gpu_node_affinity",
            "probes",
            "pdb",
            "resources",
            "shm",
            "security_context",
            "prometheus",
        )
    }
    | {"spread": st.sampled_from(["off", "preferred", "required"])}
)


def _stack(models, chosen_policies):
    named = [dict(m, name=f"m{i}") for i, m in enumerate(models)]
    return parse_stack({"name": "prop", "image": "example/railyard:1", "models": named, "policies": chosen_policies})


@SETTINGS
@given(models=st.lists(model, min_size=1, max_size=3), chosen=policies)
def test_any_valid_stack_renders_manifests_the_schemas_accept(models, chosen):
    stack = _stack(models, chosen)
    assert validate_objects(render(stack, "rayservice"), "1.30") == []


node = st.fixed_dictionaries(
    {
        "gpu": st.fixed_dictionaries(
            {"product": st.sampled_from(PRODUCTS), "count": st.sampled_from([1, 2, 4, 8]), "tainted": st.booleans()}
        ),
        "allocatable": st.fixed_dictionaries(
            {"cpu": st.sampled_from(["8", "32", "96"]), "memory": st.sampled_from(["64Gi", "512Gi"])}
        ),
        "labels": st.fixed_dictionaries({"topology.kubernetes.io/zone": st.sampled_from(["a", "b"])}),
    }
)


@SETTINGS
@given(
    models=st.lists(model, min_size=1, max_size=3), chosen=policies, inventory=st.lists(node, min_size=1, max_size=8)
)
def test_the_scheduler_never_overcommits_and_respects_static_filters(models, chosen, inventory):
    cluster = parse_nodes(
        {
            "nodes": [dict(n, name=f"n{i}") for i, n in enumerate(inventory)]
            + [{"name": "cpu", "allocatable": {"cpu": "16", "memory": "64Gi"}}]
        }
    )
    pods = pods_from_objects(render(_stack(models, chosen), "rayservice"))
    placements = KubeScheduler(cluster).schedule_all(pods)
    by_name = {n.name: n for n in cluster}
    for placement in placements:
        if placement.node is not None:
            assert static_reason(placement.pod, by_name[placement.node]) is None
        else:
            assert placement.message.startswith(f"0/{len(cluster)} nodes are available: ")
    for n in cluster:
        for resource, used in n.requested.items():
            assert used <= n.allocatable.get(resource, 0), (n.name, resource)
