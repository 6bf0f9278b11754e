"""`EngineReplica`: the body of one engine deployment replica (one engine client per replica).

The replica's engine core runs in its own process (EngineProcessClient, with the tensor-parallel ranks
it spawns), so the replica's event loop (Ray's streaming, detokenisation) never shares a GIL with the
step loop. It streams delta RequestOutputs back through Ray Serve (merged over a stream interval that grows with the
streams in flight, since every Ray item costs CPU on three processes),
loads a request's LoRA adapter into its engine at the adapter's first request here, reports its EngineStats and
the adapters it holds to the request router (`record_routing_stats`) and its load to the autoscaler
(`record_autoscaling_stats`), and fails its health check once its engine has died, so the Serve
controller replaces it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from railyard.engine.tokenizer import with_shape_tokenizer
from railyard.engine.client.base import DEFAULT_MAX_WAITING_REQUESTS, EngineClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.lora.request import LoRARequest
from railyard.engine.outputs import EngineStats, RequestOutput
from railyard.engine.startup.gc_heap import freeze_startup_heap
from railyard.engine.startup.timings import StartupTimes
from railyard.errors import EngineDeadError
from railyard.serve.logs import log_where_serve_logs
from railyard.serve.placement import expose_reserved_gpus

log = logging.getLogger("railyard.serve")

# Reporting every cached block of a large KV pool each period would flood the long poll; the
# router only needs enough to find hot prefixes.
MAX_REPORTED_PREFIX_HASHES = 50_000


@dataclass(frozen=True)
class ReplicaStarted:
    """First item of every stream: which replica took the request (before any token)."""

    replica: str
    node_id: str


@dataclass(frozen=True)
class ReplicaReport:
    """The last item of every stream: its final output with the replica's EngineStats (fleet metrics at the
    front), one item rather than two."""

    replica: str
    stats: EngineStats
    output: RequestOutput


@dataclass
class EngineRequest:
    """What the ingress sends an engine replica: the router reads `prompt_token_ids` from it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    lora: LoRARequest | None = None  # the LoRA adapter it runs with (the router also reads it)

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "prompt": self.prompt, "prompt_token_ids": self.prompt_token_ids,
                "params": self.params, "priority": self.priority, "lora": self.lora}


class EngineReplica:
    """One engine replica of one model and length pool."""

    async def __init__(self, engine: dict[str, Any], *, max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS,
                       engine_process: bool = True, stream_interval_s: float = 0.0,
                       stream_items_per_s: float = 0.0, standby_engines: int = 0,
                       standby_max_replicas: int = 1) -> None:
        """standby_engines: sleeping engines the node's pool keeps for this deployment (serve/standby.py), of which
        this replica takes its own; standby_max_replicas: the deployment's, which with the GPU share Ray gave this
        replica bounds the engines its GPU holds for the deployment."""
        import ray
        from ray import serve

        log_where_serve_logs()  # its start-up (and its engine core's, and a standby's wake-up) in the replica's log
        steps = StartupTimes()  # what this start waited for, in its log line
        config = EngineConfig(**engine)
        context = serve.get_replica_context()
        self._pool = None
        with steps.phase("shape_tokenizer"):  # a named shape speaks text as in `railyard serve`
            await asyncio.to_thread(with_shape_tokenizer, config)
        if config.tensor_parallel_size > 1 and config.device != "cpu":
            # The ranks are processes spawned here: they need every GPU the placement group reserved.
            await asyncio.to_thread(expose_reserved_gpus, config.tensor_parallel_size)
        if engine_process and standby_engines and config.tensor_parallel_size == 1:
            from railyard.engine.client.process import EngineProcessClient
            from railyard.serve.standby import pool_for, standby_slots

            config = dataclasses.replace(config, enable_sleep_mode=True)
            with steps.phase("claim"):
                gpus = ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0)
                slots = standby_slots(standby_engines, standby_max_replicas, gpus)
                self._pool = pool_for(context.app_name, context.deployment, config, standby_engines, slots)
                handoff = await self._pool.claim.remote(ray.get_runtime_context().current_actor)
            # A sleeping engine wakes while this front loads its tokenizer. token_ids_only (both paths): the ingress
            # tokenizes, so this front only detokenizes, without importing transformers (and what it imports).
            with steps.phase("engine_client"):
                self.client = await asyncio.to_thread(
                    EngineProcessClient, config, handoff=handoff, wake_on_join=True, token_ids_only=True,
                    max_waiting_requests=max_waiting_requests, stream_interval_s=stream_interval_s,
                    stream_items_per_s=stream_items_per_s)
        elif engine_process:
            from railyard.engine.client.process import EngineProcessClient

            with steps.phase("engine_client"):
                self.client: EngineClient = await asyncio.to_thread(
                    EngineProcessClient, config, token_ids_only=True, max_waiting_requests=max_waiting_requests,
                    stream_interval_s=stream_interval_s, stream_items_per_s=stream_items_per_s)
        else:
            from railyard.engine.client.inproc import InProcessEngineClient

            if config.torch_threads is not None:  # (the engine process sets its own)
                import torch

                torch.set_num_threads(config.torch_threads)
            with steps.phase("engine_client"):
                self.client = await asyncio.to_thread(InProcessEngineClient.from_config, config,
                                                      max_waiting_requests=max_waiting_requests,
                                                      stream_interval_s=stream_interval_s,
                                                      stream_items_per_s=stream_items_per_s)
        self.replica_id = context.replica_id.unique_id
        self.deployment = context.deployment
        self.node_id = ray.get_runtime_context().get_node_id()
        self._prefix_version = 0
        self._last_hashes: frozenset[int] = frozenset()
        self._loras: dict[str, LoRARequest] = {}  # the adapters this replica's engine has loaded, by name
        self._lora_locks: dict[str, asyncio.Lock] = {}
        await self.client.start()  # on the replica's event loop, where every method runs
        if self._pool is not None:
            with steps.phase("wake_up"):
                woke = await self.client.wake_up()  # None: started for this replica, awake
            log.info("engine replica %s took %s engine (pid %d)%s", self.replica_id,
                     "a standby" if woke else "a new", self.client.pid, f": {woke.get('phases_s')}" if woke else "")
            await self._pool.serving.remote(self.client.pid)
        with steps.phase("heap_freeze"):  # a replica's actor process keeps this engine client for its life
            freeze_startup_heap(collect=False)  # a burst waits for this start; the engine's process collected its own
        log.info("engine replica %s of %s ready on node %s; %s", self.replica_id, self.deployment, self.node_id,
                 steps.describe("replica start"))

    # -- requests ----------------------------------------------------------------------------------
    async def generate(self, request: dict[str, Any]) -> AsyncIterator[ReplicaStarted | ReplicaReport | RequestOutput]:
        """Stream a request's outputs; cancelling the stream (client gone) aborts it in the engine.

        Items: ReplicaStarted, then the outputs (the first at once, later ones merged over the client's
        stream interval, which grows with the replica's live streams), the final one inside a ReplicaReport:
        about output tokens / tokens per interval + 2."""
        yield ReplicaStarted(self.replica_id, self.node_id)
        lora = request.get("lora")
        if lora is not None:
            await self._ensure_lora(lora)
        stream = await self.client.add_request(
            request["request_id"], request.get("prompt"), request["params"],
            prompt_token_ids=request["prompt_token_ids"], priority=request.get("priority", 0), lora=lora)
        async for out in stream:
            yield ReplicaReport(self.replica_id, self.client.stats, out) if out.finished else out

    async def _ensure_lora(self, lora: LoRARequest) -> None:
        """Load a request's LoRA adapter into this replica's engine at its first request here (as Ray Serve's
        model multiplexing loads a model where its requests are routed); first requests arriving together wait for
        one load. The engine keeps it (its device slots and host tier evict by use, never a running request's)."""
        if self._loras.get(lora.lora_name) == lora:
            return
        async with self._lora_locks.setdefault(lora.lora_name, asyncio.Lock()):
            held = self._loras.get(lora.lora_name)
            if held == lora:
                return
            if held is not None:  # the name was loaded again from another path: the old adapter goes
                await self.client.unload_lora(lora.lora_name)
                del self._loras[lora.lora_name]
            await self.client.load_lora(lora)
            self._loras[lora.lora_name] = lora
            log.info("replica %s loaded LoRA adapter %r", self.replica_id, lora.lora_name)

    async def abort(self, request_id: str) -> None:
        self.client.abort(request_id)

    async def stats(self) -> EngineStats:
        return self.client.stats

    async def info(self) -> dict[str, Any]:
        """Facts the ingress needs (where the tokenizer is, how long a sequence may be) and the processes."""
        info = self.client.model_info
        return {"model": info.model, "tokenizer": info.tokenizer, "max_model_len": info.max_model_len,
                "block_size": info.block_size, "replica": self.replica_id, "node_id": self.node_id,
                "pid": os.getpid(), "engine_pid": info.pids[0] if info.pids else None,
                "worker_pids": list(info.pids[1:])}

    # -- what Ray Serve polls ----------------------------------------------------------------------
    async def record_routing_stats(self) -> dict[str, Any]:
        """EngineStats plus the prefix blocks this engine's cache holds (the router's view of us)."""
        report = _load_report(self.client)
        if self.client.dead is None:
            hashes = await self.client.cached_block_hashes()
            if hashes != self._last_hashes:
                self._last_hashes = frozenset(hashes)
                self._prefix_version += 1
        report["prefix_version"] = self._prefix_version
        report["prefix_hashes"] = list(self._last_hashes)[:MAX_REPORTED_PREFIX_HASHES]
        report["lora_ids"] = [lora.lora_int_id for lora in self._loras.values()]
        return report

    async def record_autoscaling_stats(self) -> dict[str, float]:
        # A dead engine is replaced by its health check, not by scaling out: it counts as idle here.
        dead = self.client.dead is not None
        return {"pending": 0.0 if dead else float(pending_requests(self.client)),
                "kv_cache_usage": float(self.client.stats.kv_cache_usage)}

    async def check_health(self) -> None:
        """Raise once the engine loop has died, so Serve marks the replica unhealthy and replaces it."""
        if not self.client.is_running:
            raise self.client.dead or EngineDeadError("the engine has stopped")

    async def __del__(self) -> None:
        if self._pool is not None and self.client.is_running:
            try:  # drained by now: its engine goes back to the pool asleep, for the next replica
                await self.client.sleep(1)
                await self._pool.give_back.remote(await self.client.detach())
                return
            except Exception as exc:  # noqa: BLE001 -- a busy or dead engine is stopped instead
                log.warning("could not give the engine back to the standby pool (%s): stopping it", exc)
        try:
            await self.client.shutdown()
        except Exception as exc:  # noqa: BLE001 -- shutting down a dead engine must not mask the replica's exit
            log.warning("engine shutdown: %s", exc)


# What a replica whose engine died reports as its load: routers send it nothing until Serve replaces it.
DEAD_ENGINE_PENDING = 1_000_000


def pending_requests(engine: EngineClient) -> int:
    """Unfinished requests: running + swapped + waiting (including those on their way to the engine)."""
    if engine.dead is not None:
        return DEAD_ENGINE_PENDING
    return engine.num_pending


def _load_report(engine: EngineClient) -> dict[str, Any]:
    stats = engine.stats
    report = {k: v for k, v in asdict(stats).items() if k != "extra"}
    report["pending"] = pending_requests(engine)
    report["free_blocks"] = stats.num_free_blocks
    report["engine_dead"] = engine.dead is not None
    return report
