"""One tensor-parallel rank: joins the group, builds its shard, then runs every step the driver sends.

Ranks 1..N-1 run `worker_main` in their own processes; rank 0 (the driver, in the engine's
process) uses `join_group` and `agree_on_kv_blocks` the same way, so every rank meets the same
collectives in the same order. Workers hold no per-request state: each step arrives as a plain
StepPlan over a pipe and only rank 0 samples.
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.connection
import os
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from railyard.engine.config import EngineConfig
from railyard.engine.exits import exit_when_parent_dies
from railyard.engine.startup.gc_heap import freeze_startup_heap
from railyard.model.spec import ModelSpec

# NVLink multicast (NVLS) is forbidden on the multi-GPU machines here; NCCL reads this at init.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}
# On an NCCL error or timeout, torch's watchdog by default (3) tears the whole process down: for a
# server that loses the clear EngineDeadError. 2 aborts the communicator and lets the error surface.
NCCL_ENV_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def set_nccl_env() -> None:
    """The NCCL settings every rank needs, before its process group exists (inherited by spawned workers)."""
    os.environ.update(NCCL_ENV)
    for key, value in NCCL_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the ranks of one replica meet (picklable, handed to each worker)."""

    host: str
    port: int
    world_size: int
    backend: str  # "nccl" on CUDA, "gloo" on CPU
    device_type: str  # "cuda" or "cpu"
    timeout_s: float  # collective timeout: the backstop behind the driver's liveness watch

    def device(self, rank: int) -> torch.device:
        return torch.device("cuda", rank) if self.device_type == "cuda" else torch.device("cpu")


def join_group(rv: Rendezvous, rank: int, store: dist.Store | None = None) -> torch.device:
    """Initialise this process's default process group as `rank`; returns the rank's device."""
    set_nccl_env()
    device = rv.device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=rv.timeout_s)
    if store is None:
        store = dist.TCPStore(rv.host, rv.port, rv.world_size, is_master=False, timeout=timeout)
    dist.init_process_group(rv.backend, store=store, rank=rank, world_size=rv.world_size, timeout=timeout)
    return device


def agree_on_kv_blocks(runner) -> tuple[int, int]:
    """Every rank profiled its own KV pool; all use the smallest (GPU blocks, CPU swap blocks)."""
    counts = torch.tensor([runner.num_gpu_blocks, runner.num_cpu_blocks], dtype=torch.int64, device=runner.device)
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)
    gpu, cpu = counts.tolist()
    return int(gpu), int(cpu)


def worker_main(rank: int, rv: Rendezvous, config: EngineConfig, spec: ModelSpec, model_dir: Path | None,
                conn: multiprocessing.connection.Connection) -> None:
    """Entry point of ranks 1..N-1: build the shard, then run each StepPlan (or sleep-mode order) until told to stop
    (None)."""
    from railyard.engine.runner.model_runner import ModelRunner
    from railyard.engine.runner.layers.parallel import ParallelState

    exit_when_parent_dies()
    if rv.device_type == "cpu":  # N ranks share the cores; oversubscribing them slows every collective
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // rv.world_size))
    try:
        device = join_group(rv, rank)
        runner = ModelRunner(config, spec, model_dir, ps=ParallelState(rank, rv.world_size), device=device)
        agree_on_kv_blocks(runner)
        freeze_startup_heap()  # this process keeps its shard for its life
        while True:
            try:
                plan = conn.recv()
            except EOFError:  # the driver is gone
                break
            if plan is None:
                break
            if isinstance(plan, tuple):  # a sleep-mode order: ("sleep", level) or ("wake_up", tags)
                getattr(runner, plan[0])(plan[1])
                continue
            runner.compute_logits(plan)
    except BaseException:
        try:
            conn.send(("error", rank, traceback.format_exc()))
        except OSError:
            pass
        os._exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
