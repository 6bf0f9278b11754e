"""Sleep mode's weights (vLLM's `enable_sleep_mode`): give the device memory of a model's weights back and restore
them later, without rebuilding the model.

Level 1 copies every parameter and buffer to host memory (pinned where the model runs on a GPU, so the copy back is
a DMA at the link's speed) and releases the device copy; level 2 keeps only the buffers (rotary tables, LoRA slots:
small, and not in the checkpoint) and drops the parameters, which wake-up reads from the checkpoint again. Either
way each parameter keeps its Parameter object (and its `weight_loader`): only its storage moves, so nothing that
holds the module sees a different model. What read the old device addresses (captured CUDA graphs) must be
captured again: the model runner drops its graphs before calling this, and captures them anew on wake-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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


@dataclass
class SleepingWeights:
    """A model's weights while it sleeps: the host copies (level 1: every parameter and buffer; level 2: the
    buffers only), each beside the tensor whose storage it replaces on wake-up."""

    level: int
    host: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (the model's tensor, its copy)
    # level 2: the parameters to read from the checkpoint again, with their shapes
    dropped: list[tuple[torch.Tensor, torch.Size]] = field(default_factory=list)

    @property
    def host_bytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for _, copy in self.host)


def put_to_sleep(model: torch.nn.Module, level: int, device: torch.device) -> SleepingWeights:
    """Release the model's device copies of its weights; returns what wake-up needs to restore them."""
    pin = device.type == "cuda"
    asleep = SleepingWeights(level)
    params, buffers = _tensors(model, params=True), _tensors(model, params=False)
    with torch.no_grad():
        for t in (params + buffers if level == 1 else buffers):
            copy = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            copy.copy_(t)
            asleep.host.append((t, copy))
        if level == 2:
            asleep.dropped = [(t, t.shape) for t in params]
        for t in params + buffers:
            t.data = torch.empty(0, dtype=t.dtype, device=device)
    return asleep


def wake_weights(asleep: SleepingWeights, device: torch.device) -> None:
    """Give the weights device storage again: the host copies copied back (asynchronously on a GPU: the caller
    synchronises), the dropped parameters zeroed for a load to fill (an expert layer's padding must stay zero, as it
    is built)."""
    with torch.no_grad():
        for t, copy in asleep.host:
            t.data = torch.empty(copy.shape, dtype=copy.dtype, device=device)
            t.data.copy_(copy, non_blocking=True)
        for t, shape in asleep.dropped:
            t.data = torch.zeros(shape, dtype=t.dtype, device=device)
