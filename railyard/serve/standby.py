"""Standby engines: a replica that scales out in the time of a wake-up, not a start.

A new engine replica spends most of its start before it serves anything: a process, torch's imports, the CUDA context,
the weights, the KV profile, graph capture, the front's tokenizer. `StandbyPool` keeps engine cores of one
deployment's exact EngineConfig started and asleep (engine sleep mode: no KV cache, weights in pinned host memory, the
CUDA context, the CUDA graphs and the compiled kernels kept) on one node's GPU. Every replica of the deployment there
takes its engine from the pool (`claim`: a sleeping one if there is one, which the replica wakes; else one started now
for it, awake, which the replica waits for as for a start of its own: one start-up, not a start, a sleep and a wake-up),
connects to it (EngineProcessClient's handoff) and serves; when the replica leaves, its engine goes back to sleep into
the pool (`give_back`). Once a replica's engine serves (`serving`), the pool refills in the background while the GPU has
room: after, not during, that engine's start or wake-up, which a standby's start would slow.

The pool's process is every core's parent (engine cores exit when their parent dies), so the pool is a detached Ray
actor per deployment, node, GPU and engine options (`pool_for`); it stops its cores and itself once no replica has
held an engine for IDLE_S (the app was deleted or scaled to zero), and with its Ray cluster. GPU accounting: a
replica's fractional GPU covers the engine it claimed; a sleeping standby holds only its CUDA context and pinned host
memory, which Ray does not count, and `slots` (engines the GPU holds for the deployment, as its fraction allows)
bounds the pool's starts, so a standby never starts where the replicas' engines leave no memory for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from railyard.engine.client.process import CoreHandoff, EngineProcessClient, spawn_core
from railyard.engine.config import EngineConfig
from railyard.serve.logs import log_where_serve_logs

log = logging.getLogger("railyard.serve")

IDLE_S = 120.0  # a pool none of whose engines a replica held this long stops (its app is gone or scaled to zero)
SLEEP_LEVEL = 1  # standbys keep their weights in pinned host memory: wake-up is a copy, not a checkpoint read
OWNER_CHECK_S = 5.0  # how often the pool asks whether the replicas holding its engines are alive


class StandbyPool:
    """Engine cores of one EngineConfig on this node's GPU, started and asleep, handed to replicas whole."""

    def __init__(self, config: EngineConfig, standby: int, slots: int, cuda_visible_devices: str | None = None) -> None:
        """standby: sleeping engines to keep ready; slots: engines (claimed, asleep or starting) the GPU holds for
        the deployment at most; cuda_visible_devices: the GPU the replicas of this pool were given."""
        if cuda_visible_devices is not None:  # the cores this process spawns inherit it
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        self.config = config
        self.standby, self.slots = standby, max(1, slots)
        self._ready: list[CoreHandoff] = []
        self._processes: dict[int, object] = {}  # pid -> its multiprocessing.Process: every core this pool started
        self._directories: dict[int, str] = {}  # pid -> the directory of its sockets' addresses
        self._claimed: set[int] = set()
        self._starting = 0
        self._idle_since: float | None = time.monotonic()
        self._refill: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None

    def counts(self) -> dict[str, int]:
        self._forget_exited()
        return {"ready": len(self._ready), "claimed": len(self._claimed), "starting": self._starting}

    def engines(self) -> dict[str, list[int]]:
        """The engine cores' pids: those waiting asleep for a replica, and those replicas hold."""
        self._forget_exited()
        return {"ready": [h.pid for h in self._ready], "claimed": sorted(self._claimed)}

    async def claim(self) -> CoreHandoff:
        """An engine for a new replica: a sleeping one if one is ready, else one started now, awake, for the replica
        to wait for (its handoff has no Ready yet)."""
        self._ensure_watch()
        self._forget_exited()
        handoff = self._ready.pop() if self._ready else await self._start_for_claim()
        self._claimed.add(handoff.pid)
        self._idle_since = None
        return handoff

    async def serving(self, pid: int) -> None:
        """The replica holding engine `pid` serves: refill behind it now (a claim alone does not, so that no
        standby's start competes with the claimed engine's start or wake-up)."""
        if pid in self._claimed:
            self._schedule_refill()

    async def give_back(self, handoff: CoreHandoff) -> None:
        """A leaving replica's engine, asleep again: ready for the next replica."""
        self._claimed.discard(handoff.pid)
        if handoff.pid in self._processes and self._processes[handoff.pid].is_alive():
            self._ready.append(handoff)
        self._mark_idle()
        self._schedule_refill()

    async def shutdown(self) -> None:
        """Stop every core this pool started (SIGTERM: each shuts down cleanly), then forget them."""
        for task in (self._refill, self._watch):
            if task is not None:
                task.cancel()
        processes = list(self._processes.values())
        for process in processes:
            process.terminate()
        for process in processes:
            await asyncio.to_thread(process.join, 10.0)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5.0)
        for directory in self._directories.values():
            shutil.rmtree(directory, ignore_errors=True)
        self._processes.clear()
        self._directories.clear()
        self._ready.clear()
        self._claimed.clear()

    def idle_for(self) -> float:
        """Seconds since a replica last held one of this pool's engines (0 while one does)."""
        return 0.0 if self._idle_since is None else time.monotonic() - self._idle_since

    # -- inside -----------------------------------------------------------------------------------
    async def _start_for_claim(self) -> CoreHandoff:
        """A core spawned for the claiming replica, connecting to the sockets the replica binds: it starts awake."""
        directory = tempfile.mkdtemp(prefix="railyard-engine-")
        try:
            process = await asyncio.to_thread(spawn_core, self.config, directory, True)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._processes[process.pid], self._directories[process.pid] = process, directory
        log.info("engine core %d of %s started for a replica (no standby was ready)", process.pid, self.config.model)
        return CoreHandoff(self.config, process.pid, directory)

    async def _start_one(self) -> CoreHandoff:
        self._starting += 1
        try:
            client = await asyncio.to_thread(EngineProcessClient, self.config, standby=True)
            try:
                await client.start()
                await client.sleep(SLEEP_LEVEL)
                handoff = await client.detach()
            except BaseException:
                await client.shutdown()
                raise
            self._processes[handoff.pid], self._directories[handoff.pid] = client.process, handoff.directory
            log.info("standby engine core %d of %s started and asleep", handoff.pid, self.config.model)
            return handoff
        finally:
            self._starting -= 1

    def _schedule_refill(self) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.get_running_loop().create_task(self._fill(), name="railyard-standby-refill")

    async def _fill(self) -> None:
        while True:
            self._forget_exited()
            total = len(self._ready) + len(self._claimed) + self._starting
            if len(self._ready) >= self.standby or total >= self.slots:
                return
            try:
                self._ready.append(await self._start_one())
            except Exception:
                log.exception("starting a standby engine failed; replicas start their own until one succeeds")
                return

    def _forget_exited(self) -> None:
        """Cores that exited (a claimed one whose replica died stops by itself) free their slot."""
        for pid, process in list(self._processes.items()):
            if not process.is_alive():
                process.join(0)
                del self._processes[pid]
                if pid in self._directories:
                    shutil.rmtree(self._directories.pop(pid), ignore_errors=True)
                self._claimed.discard(pid)
                self._ready = [h for h in self._ready if h.pid != pid]
        if not self._claimed:
            self._mark_idle()

    def _mark_idle(self) -> None:
        if not self._claimed and self._idle_since is None:
            self._idle_since = time.monotonic()

    def _ensure_watch(self) -> None:
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_exits(), name="railyard-standby-watch")

    async def _watch_exits(self) -> None:
        """Refill after a claimed core exits (its replica died), as after a claim."""
        while True:
            await asyncio.sleep(1.0)
            before = len(self._processes)
            self._forget_exited()
            if len(self._processes) < before:
                self._schedule_refill()


class _PoolActor(StandbyPool):
    """The pool as a detached Ray actor on one node: it outlives the replicas that use it, stops the engine of a
    replica that died holding it, and stops its cores and itself once none has held an engine for IDLE_S."""

    def __init__(self, *args, **kwargs) -> None:
        log_where_serve_logs()  # its standby cores' start-up and sleep lines, in this actor's .err file
        super().__init__(*args, **kwargs)
        self._reaper: asyncio.Task | None = None
        self._owners: dict[int, Any] = {}  # a claimed core's pid -> the handle of the replica actor holding it

    async def claim(self, owner: Any = None) -> CoreHandoff:
        """owner: the claiming replica's actor handle (ray.get_runtime_context().current_actor)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="railyard-standby-reaper")
        handoff = await super().claim()
        if owner is not None:
            self._owners[handoff.pid] = owner
        return handoff

    async def give_back(self, handoff: CoreHandoff) -> None:
        self._owners.pop(handoff.pid, None)
        await super().give_back(handoff)

    async def _reap(self) -> None:
        import ray

        while self.idle_for() < IDLE_S:
            await asyncio.sleep(OWNER_CHECK_S)
            await self._stop_orphans()
        log.info("no replica of %s held a standby engine for %.0f s: stopping the pool", self.config.model, IDLE_S)
        await self.shutdown()
        ray.actor.exit_actor()

    async def _stop_orphans(self) -> None:
        """Stop the claimed cores whose replica died. One that connected to its core stops it anyway (a core whose
        front goes while it is awake stops); one that died before would leave it waiting for a front forever,
        awake or asleep, in a slot, and the pool never idle."""
        from ray.exceptions import ActorDiedError

        for pid, owner in list(self._owners.items()):
            if pid not in self._claimed:  # given back, or exited
                self._owners.pop(pid, None)
                continue
            try:
                await asyncio.wait_for(owner.__ray_ready__.remote(), OWNER_CHECK_S)
            except ActorDiedError:
                log.warning("the replica holding engine core %d died: stopping that core", pid)
                self._owners.pop(pid, None)
                if pid in self._processes:
                    self._processes[pid].terminate()  # it exits; the watch frees its slot and refills
            except Exception:  # noqa: BLE001 -- busy (a timeout) or unreachable for now: not dead
                pass


def standby_slots(standby: int, max_replicas: int, gpus: float) -> int:
    """Engines (claimed, asleep or starting) one GPU may hold for a deployment whose replicas take `gpus` of it each:
    as many replicas as fit on it, no more than the deployment's max_replicas, so a standby only ever takes memory
    a replica of its own deployment could have used, never a share Ray gave another. On the CPU (gpus 0) memory is
    not counted in slots: every replica, and the standbys beside them."""
    if gpus <= 0:
        return max_replicas + standby
    return max(1, min(max_replicas, int(1 / gpus + 1e-9)))


def pool_for(app: str, deployment: str, config: EngineConfig, standby: int, slots: int):
    """The pool actor of an app's deployment on this replica's node and GPU, created by the first replica there
    (detached: it outlives the replica, as the engines it parents must). Named for the engines it holds too: two apps
    whose deployments share a name, or a redeployment with other engine options, never get another's engines (a
    pool left without replicas stops after IDLE_S)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    engines = hashlib.sha256(repr((config, standby, slots)).encode()).hexdigest()[:12]
    name = f"railyard-standby-{app}-{deployment}-{node[:16]}-{gpus or 'cpu'}-{engines}"
    actor = ray.remote(num_cpus=0)(_PoolActor).options(
        name=name, get_if_exists=True, lifetime="detached", max_concurrency=16,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    return actor.remote(config, standby, slots, gpus)
