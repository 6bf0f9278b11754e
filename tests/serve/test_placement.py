"""Placement on a two-node local Ray cluster (ray.cluster_utils.Cluster): a tensor-parallel replica's
placement-group bundles share one node (STRICT_PACK); replicas of one deployment spread over nodes."""

from __future__ import annotations

import asyncio

import pytest
from ray import serve
from ray.util import placement_group_table

from tests.serve.conftest import deploy_engines, engine_args, run_request

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def placed(serve_cluster, tiny_model_dir):
    apps = {"placement-tp2": engine_args(tiny_model_dir, tensor_parallel_size=2),
            "placement-spread": engine_args(tiny_model_dir, num_replicas=2)}
    clients = deploy_engines(apps)
    yield clients
    for app in apps:
        serve.delete(app)


def test_a_tensor_parallel_replica_keeps_its_bundles_on_one_node(serve_cluster, placed):
    groups = [pg for pg in placement_group_table().values()
              if "placement-tp2" in pg["name"] and pg["state"] == "CREATED"]
    assert len(groups) == 1, "one replica, one placement group"
    pg = groups[0]
    assert pg["strategy"] == "STRICT_PACK"
    assert len(pg["bundles"]) == 2
    assert len(set(pg["bundles_to_node_id"].values())) == 1
    # ... and its two ranks really serve: the same greedy tokens as a single-process replica.
    prompt = list(range(40, 72))
    tp2, tp1 = asyncio.run(_both(placed["placement-tp2"], placed["placement-spread"], prompt))
    assert tp2.error is None and tp1.error is None
    assert tp2.token_ids == tp1.token_ids


async def _both(a, b, prompt):
    return await asyncio.gather(run_request(a, prompt, 8), run_request(b, prompt, 8))


def test_replicas_of_one_deployment_spread_over_nodes(serve_cluster, placed):
    handle = placed["placement-spread"].pools[0].handle
    nodes: dict[str, str] = {}
    for _ in range(40):  # the router spreads idle-time calls over both replicas
        info = handle.info.remote().result()
        nodes[info["replica"]] = info["node_id"]
        if len(nodes) == 2:
            break
    assert len(nodes) == 2
    assert len(set(nodes.values())) == 2, f"both replicas landed on one node: {nodes}"
    assert set(nodes.values()) <= set(serve_cluster.node_ids)
