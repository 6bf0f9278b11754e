"""Placement on a two-node local Ray cluster (ray.cluster_utils.Cluster): a tensor-parallel replica's
placement-group bundles share one node (STRICT_PACK); replicas of one deployment spread over nodes.
Last, health: the TP replica's engine is killed for real and Serve replaces the replica."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from ray import serve
from ray.util import placement_group_table

from railyard.errors import EngineDeadError
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


def test_a_replica_whose_engine_died_is_reported_unhealthy_and_replaced(placed):
    """A real failure: a tensor-parallel rank process dies, the engine loop dies on its next step, the
    replica fails its health check and Serve starts a new one, which serves again."""
    client = placed["placement-tp2"]
    handle = client.pools[0].handle
    before = handle.info.remote().result()
    os.kill(before["worker_pids"][0], signal.SIGKILL)
    failed = asyncio.run(run_request(client, list(range(30)), 4))
    assert isinstance(failed.error, EngineDeadError)

    deadline = time.monotonic() + 120
    while handle.info.remote().result()["replica"] == before["replica"]:
        assert time.monotonic() < deadline, "no replacement for the replica whose engine died"
        time.sleep(0.5)
    again = asyncio.run(run_request(client, list(range(30)), 4))
    assert again.error is None and again.num_tokens == 4
