"""Planner speed benchmark: N nodes x M replica pods through the kube-scheduler simulation, JSON out.

`python -m railyard.cluster.plan_bench --nodes 1000 --pods 2000` (or `railyard plan --bench`). The
cluster is synthetic but shaped like a real one: 8-GPU nodes of two products over three zones, tainted,
with GFD labels, plus CPU nodes; the stack mixes TP=1/2/4 models with the default policies (GPU
tolerations, GFD affinity, preferred anti-affinity and zone spread), so every filter and score runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from railyard.cluster.nodes import parse_nodes
from railyard.cluster.render import render
from railyard.cluster.scheduler import KubeScheduler
from railyard.cluster.workload import pods_from_objects
from railyard.stack import parse_stack

PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")


def synthetic_nodes(count: int) -> list:
    """`count` nodes: 90% 8-GPU nodes alternating two products, 10% CPU nodes, over three zones."""
    gpu_nodes = count - count // 10
    inventory = []
    for i in range(count):
        entry = {
            "name": f"node-{i:05d}",
            "labels": {"topology.kubernetes.io/zone": f"zone-{i % 3}"},
            "allocatable": {"cpu": "190", "memory": "2000Gi", "pods": 110}
            if i < gpu_nodes
            else {"cpu": "32", "memory": "128Gi", "pods": 110},
        }
        if i < gpu_nodes:
            entry["gpu"] = {"product": PRODUCTS[i % 2], "count": 8, "memory_mib": 81559}
        inventory.append(entry)
    return parse_nodes({"nodes": inventory})


def synthetic_stack(pods: int):
    """A stack whose worker pods add up to `pods` (the head is one more)."""
    shares = [(1, PRODUCTS[0]), (2, PRODUCTS[1]), (4, PRODUCTS[0]), (1, PRODUCTS[1])]
    per = (pods - 1) // len(shares)
    models = []
    for k, (tp, product) in enumerate(shares):
        replicas = per if k < len(shares) - 1 else pods - 1 - per * (len(shares) - 1)
        models.append(
            {
                "name": f"model-{k}",
                "model": f"/models/m{k}",
                "tensor_parallel_size": tp,
                "num_replicas": replicas,
                "gpu_product": product,
                "resources": {"cpu": str(8 * tp), "memory": f"{64 * tp}Gi"},
            }
        )
    return parse_stack({"name": "bench", "image": "example/railyard:bench", "models": models})


def run(nodes: int, pods: int) -> dict:
    """Time one full scheduling pass; returns the JSON-able result."""
    node_list = synthetic_nodes(nodes)
    pod_list = pods_from_objects(render(synthetic_stack(pods), "rayservice"))
    start, cpu_start = time.perf_counter(), time.process_time()
    placements = KubeScheduler(node_list).schedule_all(pod_list)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "nodes": len(node_list),
        "pods": len(pod_list),
        "scheduled": sum(1 for p in placements if p.node),
        "pending": sum(1 for p in placements if not p.node),
        "elapsed_s": round(elapsed, 3),
        "cpu_s": round(cpu, 3),  # one core: the simulation is single-threaded
        "pods_per_s": round(len(pod_list) / elapsed, 1),
        "us_per_pod_node": round(elapsed / (len(pod_list) * len(node_list)) * 1e6, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard.cluster.plan_bench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args(argv)
    result = run(args.nodes, args.pods)
    print(json.dumps(result))
    print(
        f"{result['pods']} pods on {result['nodes']} nodes: {result['elapsed_s']} s wall, {result['cpu_s']} s CPU "
        f"({result['scheduled']} scheduled, {result['pending']} pending)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
