"""Sleep mode (vLLM's `enable_sleep_mode`): give the device memory of a model's weights and KV cache back, and take
it again on wake-up, without rebuilding the model.

On a GPU the weights and the KV cache are allocated from two `VirtualMemoryPool`s (`SleepMemory`): sleep unmaps
their physical memory and keeps their addresses, so every tensor and every captured CUDA graph stays valid and
wake-up captures nothing. Level 1 first copies the weights (every parameter and buffer in the pool) to pinned host
memory, and wake-up copies them back; level 2 keeps only the buffers (rotary tables: small, and not in the
checkpoint) and wake-up reads the parameters from the checkpoint again. The KV cache's contents are dropped (the
engine holds no sequence while it sleeps) and it is zeroed on wake-up, as it was allocated. What the model's
construction did not allocate (the LoRA slots, which hold adapters) stays on the device.

Where no pool is in use (the CPU), each tensor's storage itself moves: it is replaced by an empty one and by a new
one on wake-up. Each parameter keeps its Parameter object (and its `weight_loader`) either way: nothing that holds
the module sees a different model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

log = logging.getLogger("railyard.engine")

TAGS = ("weights", "kv_cache")


def _tensors(model: torch.nn.Module, params: bool) -> list[torch.Tensor]:
    """The model's parameters (or its buffers), each once however many modules share it (tied embeddings)."""
    seen: dict[int, torch.Tensor] = {}
    for t in (model.parameters() if params else model.buffers()):
        seen.setdefault(id(t), t)
    return list(seen.values())


def device_bytes(tensors) -> int:
    """Bytes the tensors hold, each storage counted once (views of one tensor share it)."""
    storages: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.numel():
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


class SleepMemory:
    """The pools the weights and the KV cache are allocated from where sleep mode keeps addresses (a GPU whose
    driver has virtual memory management); `allocating(tag)` routes a block of allocations to one."""

    def __init__(self, device: torch.device) -> None:
        from railyard.engine.runner.virtual_memory import VirtualMemoryPool

        self.device = device
        self.pools = {tag: VirtualMemoryPool(tag) for tag in TAGS}

    @classmethod
    def for_device(cls, device: torch.device, enabled: bool) -> "SleepMemory | None":
        """Pools on a GPU when sleep mode is on; None elsewhere, or where the driver refuses them (sleep then moves
        storages, and wake-up captures the graphs again)."""
        if not enabled or device.type != "cuda":
            return None
        try:
            return cls(device)
        except (OSError, AttributeError, RuntimeError) as exc:
            log.warning("sleep mode without virtual memory (%s): wake-up will capture the CUDA graphs again", exc)
            return None

    @contextlib.contextmanager
    def allocating(self, tag: str) -> Iterator[None]:
        with self.pools[tag].allocating(self.device):
            yield

    def holds(self, tensor: torch.Tensor, tag: str) -> bool:
        return self.pools[tag].contains(tensor)


def allocating(memory: SleepMemory | None, tag: str):
    """`memory.allocating(tag)`, or nothing to do without pools."""
    return memory.allocating(tag) if memory is not None else contextlib.nullcontext()


@dataclass
class SleepingWeights:
    """A model's weights while it sleeps: the host copies (level 1: every parameter and buffer; level 2: the
    buffers only), each beside the tensor it is restored into on wake-up."""

    level: int
    host: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (the model's tensor, its copy)
    # level 2: the parameters to read from the checkpoint again, with their shapes
    dropped: list[tuple[torch.Tensor, torch.Size]] = field(default_factory=list)

    @property
    def host_bytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for _, copy in self.host)


def put_to_sleep(model: torch.nn.Module, level: int, device: torch.device,
                 memory: SleepMemory | None = None) -> SleepingWeights:
    """Release the model's device copies of its weights; returns what wake-up needs to restore them. With
    `memory`, only the tensors of its weights pool are copied (the rest stay on the device) and the pool's physical
    memory is released under them; the caller has synchronised the device."""
    pin = device.type == "cuda"
    params, buffers = _tensors(model, params=True), _tensors(model, params=False)
    if memory is not None:
        params = [t for t in params if memory.holds(t, "weights")]
        buffers = [t for t in buffers if memory.holds(t, "weights")]
    asleep = SleepingWeights(level)
    with torch.no_grad():
        for t in (params + buffers if level == 1 else buffers):
            copy = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            copy.copy_(t)
            asleep.host.append((t, copy))
        if level == 2:
            asleep.dropped = [(t, t.shape) for t in params]
        if memory is not None:
            memory.pools["weights"].release()
        else:
            for t in params + buffers:
                t.data = torch.empty(0, dtype=t.dtype, device=device)
    return asleep


def wake_weights(asleep: SleepingWeights, device: torch.device, memory: SleepMemory | None = None) -> None:
    """Give the weights device memory again: the host copies copied back (asynchronously on a GPU: the caller
    synchronises), the dropped parameters zeroed for a load to fill (an expert layer's padding must stay zero, as it
    is built)."""
    with torch.no_grad():
        if memory is not None:  # put_to_sleep's pool: the tensors kept their storage, unmapped under them
            memory.pools["weights"].restore()
            for t, copy in asleep.host:
                t.copy_(copy, non_blocking=True)
            for t, _ in asleep.dropped:
                t.zero_()
            return
        for t, copy in asleep.host:
            t.data = torch.empty(copy.shape, dtype=copy.dtype, device=device)
            t.data.copy_(copy, non_blocking=True)
        for t, shape in asleep.dropped:
            t.data = torch.zeros(shape, dtype=t.dtype, device=device)
