"""`TensorParallelExecutor`: one replica's model spread over tensor_parallel_size processes.

The driver (rank 0) lives in the engine's process: each step it plans once, pipes the StepPlan to
the workers (ranks 1..N-1, one spawned process per GPU), runs its own shard and samples. Rank 0's
share runs on a helper thread so the engine's thread never blocks inside a collective: it waits
on that thread *and* on every worker's process sentinel, so a worker that dies turns into an
EngineDeadError within moments instead of a hang. Collective timeouts are only the backstop.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import multiprocessing.connection
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from railyard.engine.config import EngineConfig
from railyard.engine.exits import describe_exit
from railyard.engine.runner.model_runner import ModelRunner, StepPlan, resolve_device
from railyard.engine.runner.layers.parallel import ParallelState
from railyard.engine.runner.sampler import DoneSample, SamplerOutput, sample
from railyard.engine.sched.scheduler import SchedulerOutput
from railyard.engine.runner.tp_worker import Rendezvous, agree_on_kv_blocks, join_group, set_nccl_env, worker_main
from railyard.errors import ConfigError, EngineDeadError, RailyardError
from railyard.model.spec import ModelSpec, check_tensor_parallel

log = logging.getLogger("railyard.engine")

_GRACE_S = 2.0  # how long a failed collective waits for the dead peer's sentinel, to name the culprit
_STOP_S = 5.0  # how long shutdown waits for each stage before forcing it


class _Rank0Thread:
    """Runs rank 0's work (which enters collectives) off the caller's thread, one job at a time.

    Completion is signalled on a pipe so the caller can wait on it together with process sentinels.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done_r, self._done_w = multiprocessing.connection.Pipe(duplex=False)
        self._result: tuple[bool, Any] | None = None
        self.busy = False
        threading.Thread(target=self._loop, name="tp-rank0", daemon=True).start()

    @property
    def done_handle(self) -> multiprocessing.connection.Connection:
        return self._done_r

    def submit(self, fn: Callable[[], Any]) -> None:
        self.busy = True
        self._jobs.put(fn)

    def take(self) -> Any:
        """The finished job's result (re-raising its exception); call once done_handle is ready."""
        self._done_r.recv_bytes()
        self.busy = False
        ok, value = self._result
        self._result = None
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            fn = self._jobs.get()
            if fn is None:
                return
            try:
                result = (True, fn())
            except BaseException as exc:  # handed to the caller
                result = (False, exc)
            del fn  # holds the executor: an idle thread must not keep it from being collected
            self._result = result
            del result
            self._done_w.send_bytes(b"1")


def loopback_store(world_size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The ranks' rendezvous store, listening on 127.0.0.1 only (the workers are local processes).

    Given a host, TCPStore still binds every interface (`::`), which would let anyone who reaches the node
    write into the replica's rendezvous; a socket bound to loopback, handed over as its listening
    descriptor, keeps it local. Port 0: the OS picks a free port, and the held socket closes any race for it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], world_size, is_master=True,
                              wait_for_workers=False, timeout=timeout, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    return store


class TensorParallelExecutor:
    """Drives tensor_parallel_size ranks: this process is rank 0, workers are spawned processes."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, model_dir: Path | None) -> None:
        tp = config.tensor_parallel_size
        check_tensor_parallel(spec, tp)
        device = resolve_device(config.device)
        if device.type == "cuda" and torch.cuda.device_count() < tp:
            raise ConfigError(f"tensor_parallel_size {tp} needs {tp} visible GPUs but torch sees "
                              f"{torch.cuda.device_count()}; lower it or expose more GPUs (CUDA_VISIBLE_DEVICES)")
        if dist.is_initialized():
            raise ConfigError("this process already belongs to a torch.distributed group (another tensor-parallel "
                              "engine?); run one tensor-parallel engine per process")
        self.world_size = tp
        self._dead: str | None = None
        self._ready = False
        self._workers: list[Any] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        self._rank0 = _Rank0Thread()
        # Also on garbage collection and at interpreter exit: workers never outlive a forgotten engine.
        self._finalizer = weakref.finalize(self, _release, self._workers, self._conns, self._rank0)
        try:
            # Port 0: the OS picks a free port, and holding the listening store closes any race for it.
            store = loopback_store(tp, datetime.timedelta(seconds=config.tp_timeout_s))
            rv = Rendezvous("127.0.0.1", store.port, tp, "nccl" if device.type == "cuda" else "gloo", device.type,
                            config.tp_timeout_s)
            self._spawn_workers(rv, config, spec, model_dir)
            self.runner, (self.num_gpu_blocks, self.num_cpu_blocks) = self._call_rank0(
                lambda: self._start_rank0(rv, store, config, spec, model_dir))
            self._ready = True
        except BaseException:
            self.shutdown()
            raise
        log.info("tensor parallel over %d ranks (%s): worker pids %s; %d KV blocks per rank", tp, rv.backend,
                 self.worker_pids, self.num_gpu_blocks)

    # -- startup -----------------------------------------------------------------------------------
    def _spawn_workers(self, rv: Rendezvous, config: EngineConfig, spec: ModelSpec, model_dir: Path | None) -> None:
        ctx = torch_mp.get_context("spawn")
        set_nccl_env()
        # Daemon workers die with a normally exiting parent; a daemon parent may not have daemon children,
        # and there (as after a SIGKILL) the workers' own parent-death watch ends them.
        daemon = not multiprocessing.current_process().daemon
        for rank in range(1, rv.world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(rank, rv, config, spec, model_dir, child_end),
                               name=f"railyard-tp-rank{rank}", daemon=daemon)
            proc.start()
            child_end.close()
            self._workers.append(proc)
            self._conns.append(parent_end)

    def _start_rank0(self, rv: Rendezvous, store, config, spec, model_dir) -> tuple[ModelRunner, tuple[int, int]]:
        device = join_group(rv, 0, store)
        runner = ModelRunner(config, spec, model_dir, ps=ParallelState(0, rv.world_size), device=device)
        return runner, agree_on_kv_blocks(runner)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._workers]

    # -- the executor interface --------------------------------------------------------------------
    supports_async = False  # each step waits for the workers; the engine plans steps one at a time

    def launch(self, out: SchedulerOutput) -> DoneSample:
        return DoneSample(self.execute(out))

    def launch_forward(self, out: SchedulerOutput) -> tuple[StepPlan, list]:
        """The step's plan and sampling rows, taken now; the ranks run it in launch_sample (steps are synchronous)."""
        return self.runner.plan(out), self.runner.sampling_rows(out)

    def launch_sample(self, forward: tuple[StepPlan, list], bitmask=None) -> DoneSample:
        return DoneSample(self._run(*forward, bitmask))

    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """Plan once, send the plan to every worker, run rank 0's shard and sample on rank 0."""
        return self._run(self.runner.plan(out), self.runner.sampling_rows(out), None)

    def _run(self, plan: StepPlan, rows: list, bitmask) -> SamplerOutput:
        self._broadcast(plan)

        def step() -> SamplerOutput:
            logits = self.runner.compute_logits(plan)
            if logits is None:
                return SamplerOutput([], [])
            if bitmask is not None:  # [structured outputs] constrained rows, masked on rank 0 (it alone samples)
                from railyard.engine.runner.logits_mask import apply_bitmask

                apply_bitmask(logits, bitmask)
            return sample(logits, rows)

        return self._call_rank0(step)

    def _broadcast(self, message) -> None:
        """Send a step's plan (or a sleep-mode order) to every worker."""
        if self._dead:
            raise EngineDeadError(self._dead)
        for rank, conn in enumerate(self._conns, start=1):
            try:
                conn.send(message)
            except OSError:  # the worker's end is gone: it died
                self._die(self._diagnose(wait_s=_GRACE_S) or f"tensor-parallel worker rank {rank} stopped reading")

    def check_health(self) -> None:
        """Raise EngineDeadError if a worker has died or failed, even while no step is running."""
        if self._dead:
            raise EngineDeadError(self._dead)
        reason = self._diagnose(wait_s=0.0)
        if reason:
            self._die(reason)

    def forget(self, seq_id: int) -> None:
        self.runner.forget(seq_id)  # per-sequence state (generators) lives on rank 0 only

    # -- sleep mode: every rank sleeps and wakes its own shard (a warm-up's collectives meet as a step's do) ------
    def sleep(self, level: int) -> None:
        self._broadcast(("sleep", level))
        self._call_rank0(lambda: self.runner.sleep(level))

    def wake_up(self, tags: frozenset[str]):
        self._broadcast(("wake_up", tags))
        return self._call_rank0(lambda: self.runner.wake_up(tags))

    def device_memory(self) -> dict[str, int]:
        return self.runner.device_memory()  # rank 0's shard

    def prefetch_lora(self, request) -> None:
        """Nothing ahead: every rank reads its shard of an adapter when a step first loads it into a slot."""

    def forget_lora(self, lora_int_id: int) -> None:
        """Nothing: each rank's host tier drops adapters least recently used first."""

    def shutdown(self) -> None:
        """Stop the workers (politely, then by force) and leave the process group; idempotent."""
        self._dead = self._dead or "the engine was shut down"
        self._finalizer()

    # -- waiting without hanging -------------------------------------------------------------------
    def _call_rank0(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the rank-0 thread; return its result, or raise EngineDeadError if any rank fails."""
        if self._rank0.busy:  # the caller was interrupted (e.g. KeyboardInterrupt) while a step was in flight
            self._die("a tensor-parallel step was interrupted while in flight, so the ranks are out of step")
        self._rank0.submit(fn)
        watched = [self._rank0.done_handle, *self._conns, *(p.sentinel for p in self._workers)]
        while True:
            ready = multiprocessing.connection.wait(watched)
            if self._rank0.done_handle in ready:
                try:
                    return self._rank0.take()
                except RailyardError as exc:
                    if not self._ready:
                        raise  # a config or model error while rank 0 loads: the user's to fix, not a crash
                    self._die(self._diagnose(wait_s=_GRACE_S) or f"tensor-parallel rank 0 failed: {exc}", exc)
                except Exception as exc:
                    # A collective failing on rank 0 usually means a peer died: name the peer if so.
                    self._die(self._diagnose(wait_s=_GRACE_S) or f"tensor-parallel rank 0 failed: {exc}", exc)
            reason = self._diagnose(wait_s=0.0)
            if reason:
                self._die(reason)

    def _diagnose(self, wait_s: float) -> str | None:
        """A message naming the first worker that died or reported an error, or None if all are well."""
        handles = [*self._conns, *(p.sentinel for p in self._workers)]
        if not multiprocessing.connection.wait(handles, timeout=wait_s):
            return None
        for rank, (proc, conn) in enumerate(zip(self._workers, self._conns), start=1):
            try:
                report = conn.recv() if conn.poll() else None
            except (EOFError, OSError):  # its end closed: the process is exiting
                report = None
                proc.join(0.5)
            if report is not None and report[0] == "error":
                last = report[2].strip().splitlines()[-1]
                return f"tensor-parallel worker rank {rank} (pid {proc.pid}) failed: {last}"
            if not proc.is_alive():
                hint = "" if self._ready else (" while starting (its stderr says why; a script that starts an engine "
                                               "needs an `if __name__ == '__main__':` guard, as workers are spawned)")
                return (f"tensor-parallel worker rank {rank} (pid {proc.pid}) died "
                        f"({describe_exit(proc.exitcode)}){hint}")
        return None

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
        self._dead = f"{reason}; the engine cannot continue and must be restarted"
        log.error("%s", self._dead)
        raise EngineDeadError(self._dead) from cause


def _release(workers: list, conns: list, rank0: _Rank0Thread) -> None:
    """Stop the workers (politely, then by force), leave the process group, stop the rank-0 thread.

    Runs once per executor: from shutdown(), when the executor is garbage collected, or at exit.
    """
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + _STOP_S
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for conn in conns:
        conn.close()
    if dist.is_initialized():
        _leave_group()
    rank0.stop()


def _leave_group() -> None:
    # Not on the rank-0 thread: if it is stuck in a collective with a dead peer (NCCL), destroying
    # the group from here is what aborts that collective. Bounded, so shutdown itself cannot hang.
    done = threading.Event()

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception as exc:  # the group may already be broken by a dead peer
            log.warning("leaving the tensor-parallel group failed: %s", exc)
        done.set()

    threading.Thread(target=destroy, name="tp-destroy", daemon=True).start()
    if not done.wait(_STOP_S):
        log.warning("the tensor-parallel process group did not shut down within %.0f s", _STOP_S)

