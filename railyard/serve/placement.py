"""GPUs for a tensor-parallel replica: all of its placement group's bundles, visible to its process.

A TP replica's ranks are local processes (the engine's TensorParallelExecutor spawns ranks 1..N-1
next to rank 0), while Ray shows an actor only the GPU of its own bundle. The replica's placement
group (STRICT_PACK, so every bundle sits on this node) reserves one GPU per bundle; a short task in
each other bundle reads which GPU Ray assigned it, and the replica widens CUDA_VISIBLE_DEVICES to
all of them before CUDA is initialised, so the spawned ranks inherit exactly the reserved GPUs.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("railyard.serve")


def _assigned_gpu_ids() -> list[str]:
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


def reserved_gpu_ids(tensor_parallel_size: int) -> list[str] | None:
    """GPU ids of every bundle of this actor's placement group (own bundle first); None off-GPU or without one."""
    import ray
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    own = _assigned_gpu_ids()
    group = get_current_placement_group()
    if tensor_parallel_size <= 1 or not own or group is None:
        return None
    probe = ray.remote(num_cpus=0, num_gpus=1)(_assigned_gpu_ids)
    refs = [probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i))
            .remote() for i in range(1, tensor_parallel_size)]
    ids = list(own)
    for found in ray.get(refs, timeout=120):
        ids += [g for g in found if g not in ids]
    return ids


def expose_reserved_gpus(tensor_parallel_size: int) -> None:
    """Make the placement group's GPUs visible to this process (call before anything touches CUDA)."""
    ids = reserved_gpu_ids(tensor_parallel_size)
    if ids is None:
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    log.info("tensor-parallel replica: GPUs %s of its placement group are visible to its ranks", ids)
