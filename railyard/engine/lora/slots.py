"""Which LoRA adapter each device slot holds: pure bookkeeping, decided by the scheduler every step.

A step's adapters that are not resident take a free slot or evict the least recently used adapter that no running
sequence uses (the scheduler admits at most max_loras distinct adapters among the running sequences, so there is
always one). The loads go to the model runner with the step, which makes them before its forward pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from railyard.engine.lora.request import LoRARequest


class LoRASlots:
    """max_loras device slots, each empty or holding one adapter (by lora_int_id)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.holder: list[int | None] = [None] * num_slots
        self.slot_of: dict[int, int] = {}
        self.recent: OrderedDict[int, None] = OrderedDict()  # resident adapters, least recently used first
        self.num_loads = 0

    def assign(self, step: Iterable[LoRARequest],
               pinned: set[int]) -> tuple[dict[int, int], list[tuple[int, LoRARequest]]]:
        """Slots for a step's adapters: ({lora_int_id: slot}, [(slot, adapter) to load first]).

        pinned: adapters of running sequences, never evicted (the step's own are among them)."""
        wanted = {req.lora_int_id: req for req in step}
        loads: list[tuple[int, LoRARequest]] = []
        for lora_id, req in wanted.items():
            if lora_id in self.slot_of:
                self.recent.move_to_end(lora_id)
                continue
            slot = self._free_slot(pinned | wanted.keys())
            self.holder[slot], self.slot_of[lora_id] = lora_id, slot
            self.recent[lora_id] = None
            loads.append((slot, req))
        self.num_loads += len(loads)
        return {lora_id: self.slot_of[lora_id] for lora_id in wanted}, loads

    def _free_slot(self, keep: set[int]) -> int:
        if None in self.holder:
            return self.holder.index(None)
        victim = next((lora_id for lora_id in self.recent if lora_id not in keep), None)
        if victim is None:
            raise RuntimeError("more adapters in one step than LoRA slots (the scheduler should have prevented it)")
        return self.release(victim)

    def release(self, lora_int_id: int) -> int | None:
        """Empty the adapter's slot (an eviction, or an unloaded adapter); returns the slot (None: not resident)."""
        slot = self.slot_of.pop(lora_int_id, None)
        if slot is not None:
            self.holder[slot] = None
            del self.recent[lora_int_id]
        return slot

    @property
    def resident(self) -> list[int]:
        """Adapter ids on the device, least recently used first."""
        return list(self.recent)
