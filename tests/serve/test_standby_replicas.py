"""Standby engines on real Ray Serve: with autoscaling.standby_engines 1 the deployment's replica takes its engine
from its node's pool (a detached actor that parents the engine cores), the pool keeps one more asleep beside it, and a
replica that goes gives its engine back asleep instead of stopping it. The burst case: a replica added by scaling
out takes the engine the pool already held asleep (no start), serves the first replica's greedy tokens, and the
pool refills behind it within its slots; scaled back in, that engine goes back to sleep in the pool. And a replica
that dies holding a claim it never connected to does not leave its engine waiting forever: the pool stops it."""

from __future__ import annotations

import asyncio
import copy
import os
import re

import httpx
import pytest
import ray
from ray import serve
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from railyard.engine.config import EngineConfig
from railyard.serve.app import build_app
from railyard.serve.launch import deploy
from railyard.serve.standby import pool_for, standby_slots
from railyard.stack import parse_stack, to_serve_config
from tests.serve.conftest import engine_args, engine_client, run_request, running_replicas, wait_until

pytestmark = pytest.mark.timeout(300)

APP, PREFIX, DEPLOYMENT = "standby", "/standby", "engine-tiny-default"
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_pending_per_replica": 8, "standby_engines": 1}
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own node label: replicas pinned to one node share that node's pool


def _pool(app: str, deployment: str = DEPLOYMENT):
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
              if a["name"].startswith(f"railyard-standby-{app}-{deployment}-")]
    assert len(actors) == 1, actors
    return ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"])


def test_a_replica_serves_from_the_pool_which_keeps_a_standby_and_takes_the_engine_back(serve_cluster,
                                                                                       tiny_model_dir):
    serve.run(build_app(engine_args(tiny_model_dir, autoscaling=AUTOSCALING)), name=APP, route_prefix=PREFIX)
    pool = None
    try:
        resp = httpx.post(f"{serve_cluster.http_url}{PREFIX}/v1/completions", timeout=120,
                          json={"model": "tiny", "prompt": [5, 17, 42, 99], "max_tokens": 8, "temperature": 0,
                                "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 8
        pool = _pool(APP)
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 1, "claimed": 1, "starting": 0},
                               120, "a standby beside the replica's engine"))
        serve.delete(APP)
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 2, "claimed": 0, "starting": 0},
                               120, "the replica's engine back in the pool, asleep"))
    finally:
        serve.delete(APP)
        if pool is not None:
            ray.get(pool.shutdown.remote())
            ray.kill(pool)


BURST_APP, BURST_MODEL = "standby-burst", "burst"
BURST_DEPLOYMENT = f"engine-{BURST_MODEL}-default"
BURST_SLOTS = standby_slots(AUTOSCALING["standby_engines"], AUTOSCALING["max_replicas"], gpus=0.0)  # on the CPU
PROMPT = [5, 17, 42, 99, 7, 63]


def _burst_config(model_dir: str, node_id: str) -> dict:
    """The burst stack's Ray Serve config (`railyard serve --config`), every replica on one node (their pool is per
    node)."""
    stack = parse_stack({"name": BURST_APP, "image": "railyard:test", "models": [
        {"name": BURST_MODEL, "model": model_dir,
         "engine": {"max_model_len": 1024, "dtype": "float32", "torch_threads": 1},
         "autoscaling": {**AUTOSCALING, "downscale_delay_s": 1.0},
         "lifecycle": {"graceful_shutdown_timeout_s": 60.0, "graceful_shutdown_wait_loop_s": 0.2}}]})
    config = to_serve_config(stack)
    app = config["applications"][0]
    app["route_prefix"] = f"/{BURST_APP}"  # the suite's proxy serves other apps beside it
    (deployment,) = app["deployments"]
    deployment["ray_actor_options"]["label_selector"] = {NODE_ID_LABEL: node_id}
    return config


def _deploy_burst(config: dict, min_replicas: int) -> None:
    """The config at min_replicas replicas (its deployment's autoscaling_config alone: from the second deploy on, a
    lightweight update that adds or removes replicas, as the autoscaler does), routed round robin (each call to the
    next replica)."""
    config = copy.deepcopy(config)
    config["applications"][0]["deployments"][0]["autoscaling_config"]["min_replicas"] = min_replicas
    deploy(config, cpu=True, router="round_robin", timeout_s=240)


def _infos(handle, replicas: int) -> dict[str, dict]:
    """Each running replica's info(), by replica id (round robin: consecutive calls go to each in turn)."""
    infos: dict[str, dict] = {}
    for _ in range(8 * replicas):
        info = handle.info.remote().result()
        infos[info["replica"]] = info
        if len(infos) == replicas:
            break
    assert len(infos) == replicas, infos
    return infos


async def _tokens_by_replica(client, replicas: int) -> dict[str, list[int]]:
    """The same greedy request until every replica has served it: its tokens from each."""
    tokens: dict[str, list[int]] = {}
    for _ in range(8 * replicas):
        served = await run_request(client, PROMPT, 8)
        assert served.error is None, served.error
        tokens[served.replica] = served.token_ids
        if len(tokens) == replicas:
            break
    assert len(tokens) == replicas, tokens
    return tokens


def test_a_replica_added_takes_the_engine_the_pool_held_asleep_and_gives_it_back_when_scaled_in(serve_cluster,
                                                                                              tiny_model_dir):
    node = serve_cluster.node_ids[0]
    config = _burst_config(tiny_model_dir, node)
    pool = None
    try:
        _deploy_burst(config, 1)
        handle = serve.get_deployment_handle(BURST_DEPLOYMENT, BURST_APP)
        client = engine_client(handle, tiny_model_dir, BURST_MODEL)
        pool = _pool(BURST_APP, BURST_DEPLOYMENT)
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 1, "claimed": 1, "starting": 0},
                               120, "a standby asleep beside the first replica's engine"))
        (first,) = _infos(handle, 1).values()
        engines = ray.get(pool.engines.remote())
        assert engines["claimed"] == [first["engine_pid"]]
        (asleep,) = engines["ready"]

        _deploy_burst(config, 2)  # the burst's scale-out
        asyncio.run(wait_until(lambda: running_replicas(BURST_APP, BURST_DEPLOYMENT) == 2, 120, "a second replica"))
        infos = _infos(handle, 2)
        assert first["replica"] in infos  # scaled out: the first replica stays
        (added,) = (info for replica, info in infos.items() if replica != first["replica"])
        assert added["engine_pid"] == asleep  # the sleeping engine, woken: no engine was started for the replica
        # the replica's own log says so, with where the wake-up's time went (railyard's lines in Serve's files)
        replica_log = _replica_log(added["replica"])
        assert f"engine replica {added['replica']} took a standby engine (pid {asleep}): {{" in replica_log
        # and what its start waited for, step by step
        assert re.search(r"ready on node \S+; replica start: total [\d.]+ s = heap_freeze [\d.]+ \+ claim [\d.]+ \+ "
                         r"engine_client [\d.]+ \+ shape_tokenizer [\d.]+ \+ wake_up [\d.]+", replica_log), \
            replica_log[-2000:]
        assert added["node_id"] == node
        tokens = asyncio.run(_tokens_by_replica(client, 2))
        assert tokens[added["replica"]] == tokens[first["replica"]]
        assert len(tokens[first["replica"]]) == 8
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 1, "claimed": 2, "starting": 0},
                               120, "the pool refilled behind the claim"))
        engines = ray.get(pool.engines.remote())
        assert sorted(engines["claimed"]) == sorted([first["engine_pid"], asleep])
        assert engines["ready"][0] not in (first["engine_pid"], asleep)  # a new standby, in the third slot
        assert len(engines["ready"]) + len(engines["claimed"]) <= BURST_SLOTS

        _deploy_burst(config, 1)  # the burst is over: scale in
        asyncio.run(wait_until(lambda: running_replicas(BURST_APP, BURST_DEPLOYMENT) == 1, 120, "one replica left"))
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 2, "claimed": 1, "starting": 0},
                               120, "the leaving replica's engine back in the pool"))
        (kept,) = _infos(handle, 1).values()
        engines = ray.get(pool.engines.remote())
        assert engines["claimed"] == [kept["engine_pid"]]
        gone = ({first["engine_pid"], asleep} - {kept["engine_pid"]}).pop()
        assert gone in engines["ready"]  # asleep in the pool again, not stopped: the next replica wakes it
        assert asyncio.run(_tokens_by_replica(client, 1))[kept["replica"]] == tokens[first["replica"]]
    finally:
        serve.delete(BURST_APP)
        if pool is not None:
            ray.get(pool.shutdown.remote())
            ray.kill(pool)


def _replica_log(replica_id: str) -> str:
    """The replica's Ray Serve log file (the session's logs/serve)."""
    from pathlib import Path

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    (path,) = logs.glob(f"replica_*_{replica_id}.log")
    return path.read_text()


@ray.remote(num_cpus=0)
class _Claimer:
    """A replica's first move alone: claim an engine from its node's pool, then nothing (killed before connecting)."""

    def claim(self, config: EngineConfig) -> int:
        pool = pool_for("orphans", "engine-orphan", config, 0, 1)
        return ray.get(pool.claim.remote(ray.get_runtime_context().current_actor)).pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_engine_of_a_replica_that_died_before_taking_it_is_stopped_and_its_slot_freed(serve_cluster,
                                                                                         tiny_model_dir):
    config = EngineConfig(model=tiny_model_dir, device="cpu", max_model_len=128, num_gpu_blocks=64,
                          enable_sleep_mode=True, torch_threads=1)
    claimer = _Claimer.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(serve_cluster.node_ids[0], soft=False)).remote()
    pid = ray.get(claimer.claim.remote(config))  # an engine started for it (none was asleep), waiting for its front
    pool = _pool("orphans", "engine-orphan")
    try:
        assert ray.get(pool.engines.remote()) == {"ready": [], "claimed": [pid]}
        ray.kill(claimer)
        asyncio.run(wait_until(lambda: ray.get(pool.counts.remote()) == {"ready": 0, "claimed": 0, "starting": 0},
                               120, "the dead replica's engine stopped and its slot freed"))
        assert not _alive(pid)
    finally:
        ray.get(pool.shutdown.remote())
        ray.kill(pool)
