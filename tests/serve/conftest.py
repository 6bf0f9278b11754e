"""One real Ray cluster for the whole serve suite: two local nodes (ray.cluster_utils.Cluster),
Serve with its HTTP proxy on the head node. Starting Ray costs ~15 s on two cores, so every test
shares it and deploys (then deletes) its own applications."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import serve
from ray.cluster_utils import Cluster
from ray.serve import RunTarget

from railyard.engine.config import SamplingParams
from railyard.engine.tokenizer import load_tokenizer
from railyard.model.spec import read_model_spec
from railyard.serve.app import bind_engine
from railyard.serve.client import PoolHandle, RayEngineClient
from railyard.serve.spec import parse_app_args

REPO_ROOT = Path(__file__).resolve().parents[2]
CPUS_PER_NODE = 6  # logical CPUs Ray may hand out per node (replicas take 1 each; they mostly wait)


# Ray takes ports 10002-19999 for its workers by default; the kernel's ephemeral range starts above what we pick.
_PORTS_FROM = 20000


def _free_port() -> int:
    """A port free now, below the kernel's ephemeral range. The ports picked here are bound seconds later (after Ray
    has started), and one from the ephemeral range (what binding port 0 gives) may meanwhile be taken by any
    process's outgoing connection or its own bind to port 0: Ray opens many, and a second copy of the suite more."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(_PORTS_FROM, max(ephemeral_low, _PORTS_FROM + 1000))
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{_PORTS_FROM}, {ephemeral_low})")


@dataclass
class ServeCluster:
    cluster: Cluster
    http_url: str
    node_ids: list[str]


@pytest.fixture(scope="session")
def serve_cluster() -> ServeCluster:
    # Replica processes import railyard from this checkout (engine_args keeps torch to one thread each).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    cluster.add_node(num_cpus=CPUS_PER_NODE)
    ray.init(address=cluster.address, log_to_driver=False)
    port = _free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    try:
        yield ServeCluster(cluster, f"http://127.0.0.1:{port}", [n["NodeID"] for n in ray.nodes() if n["Alive"]])
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model) -> str:
    return tiny_model


def engine_args(model_dir: str, name: str = "tiny", *, router: str = "pending_prefix", num_replicas: int = 1,
                autoscaling: dict | None = None, engine: dict | None = None, pool: dict | None = None,
                tensor_parallel_size: int = 1) -> dict:
    """Serve app args for one CPU model with one pool (the stack's shape plus the test-only extras)."""
    pool_args = {"name": "default", "max_prompt_tokens": None, "num_replicas": num_replicas, **(pool or {})}
    if autoscaling:
        pool_args["autoscaling"] = autoscaling
    return {"models": [{"name": name, "model": model_dir, "tensor_parallel_size": tensor_parallel_size,
                        "engine": {"device": "cpu", "max_model_len": 1024, "torch_threads": 1, **(engine or {})},
                        "pools": [pool_args]}],
            "router": {"name": router, "stats_period_s": 0.5},
            # One ingress (the serve layer's default is two): the specs read the front's /metrics, which is per
            # ingress process, and a second one only costs CPU here.
            "ingress": {"num_replicas": 1},
            "replica": {"health_check_period_s": 1.0, "health_check_timeout_s": 10.0,
                        "graceful_shutdown_timeout_s": 60.0, "graceful_shutdown_wait_loop_s": 0.2}}


def deploy_engines(apps: dict[str, dict]) -> dict[str, RayEngineClient]:
    """Deploy each {app name: args}'s first model pool as its own Serve app (all at once, in parallel);
    returns a client over each app's deployment handle once every app is running."""
    targets, clients = [], {}
    for app_name, args in apps.items():
        spec = parse_app_args(args)
        model, pool = spec.models[0], spec.models[0].pools[0]
        targets.append(RunTarget(target=bind_engine(spec, model, pool), name=app_name, route_prefix=None))
        clients[app_name] = (model, pool)
    handles = serve.run_many(targets, wait_for_applications_running=True)
    for (app_name, (model, pool)), handle in zip(list(clients.items()), handles):
        clients[app_name] = engine_client(handle, model.model, model.name, pool.name)
    return clients


def engine_client(handle, model_dir: str, name: str, pool: str = "default") -> RayEngineClient:
    """A client over one engine deployment's handle, as the ingress holds one (max_model_len 1024)."""
    return RayEngineClient(name, [PoolHandle(pool, None, handle, 1024)], load_tokenizer(model_dir),
                           max_model_len=1024, vocab_size=read_model_spec(model_dir).vocab_size)


def deploy_engine(args: dict, app_name: str) -> RayEngineClient:
    return deploy_engines({app_name: args})[app_name]


def running_replicas(app_name: str, deployment: str) -> int:
    app = serve.status().applications.get(app_name)
    if app is None or deployment not in app.deployments:
        return 0
    return app.deployments[deployment].replica_states.get("RUNNING", 0)


async def wait_until(predicate, timeout_s: float, what: str, period_s: float = 0.25) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(period_s)


@dataclass
class Served:
    """One finished (or failed) request: which replica served it and what came back."""

    replica: str | None
    replicas_tried: list[str]
    num_tokens: int
    cached_prompt_tokens: int
    prompt_tokens: int
    started: bool
    error: BaseException | None = None
    token_ids: list[int] | None = None


async def run_request(client: RayEngineClient, token_ids: list[int], max_tokens: int,
                      request_id: str | None = None, on_start=None) -> Served:
    """Send one request (greedy, EOS ignored) and read it to the end; errors are returned, not raised."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    stream = await client.add_request(request_id or client.new_request_id(), None, params,
                                      prompt_token_ids=token_ids)
    last, started, error = None, False, None
    try:
        async for out in stream:
            if not started and on_start is not None:
                on_start(stream.replica)
            started = True
            last = out
    except Exception as exc:  # noqa: BLE001 -- the test decides whether this failure was allowed
        error = exc
    return Served(stream.replica, list(stream.replicas_tried),
                  len(last.outputs[0].token_ids) if last else 0,
                  last.metrics.num_cached_prompt_tokens if last else 0, len(token_ids), started, error,
                  list(last.outputs[0].token_ids) if last else None)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items) -> None:
    """A test that uses the shared Ray cluster is a `ray` test (`pytest -m "not ray"` leaves it out)."""
    for item in items:
        if "serve_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
