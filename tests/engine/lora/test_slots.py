"""The device slot pool: an adapter already resident keeps its slot; a new one takes a free slot, else the least
recently used adapter's that no running sequence uses; an adapter of a running sequence is never evicted."""

from __future__ import annotations

import pytest

from railyard.engine.lora.request import LoRARequest
from railyard.engine.lora.slots import LoRASlots

A, B, C, D = (LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("abcd", start=1))


def test_new_adapters_take_free_slots_and_are_loaded_once():
    slots = LoRASlots(2)
    assert slots.assign([A, B], pinned={1, 2}) == ({1: 0, 2: 1}, [(0, A), (1, B)])
    assert slots.assign([B, A], pinned={1, 2}) == ({1: 0, 2: 1}, [])
    assert slots.num_loads == 2


def test_a_full_pool_evicts_the_least_recently_used_adapter():
    slots = LoRASlots(2)
    slots.assign([A], pinned=set())
    slots.assign([B], pinned=set())
    slots.assign([A], pinned=set())  # A used again: B is now the least recently used
    assert slots.assign([C], pinned={3}) == ({3: 1}, [(1, C)])
    assert slots.resident == [1, 3]


def test_an_adapter_of_a_running_sequence_is_never_evicted():
    slots = LoRASlots(2)
    slots.assign([A, B], pinned={1, 2})
    slots.assign([B], pinned={1, 2})  # A is least recently used, but its sequences are still running
    assert slots.assign([C], pinned={1, 3}) == ({3: 1}, [(1, C)])
    assert slots.holder == [1, 3]


def test_more_adapters_in_a_step_than_slots_is_a_scheduler_bug_not_a_silent_eviction():
    slots = LoRASlots(2)
    with pytest.raises(RuntimeError, match="more adapters in one step than LoRA slots"):
        slots.assign([A, B, C], pinned={1, 2, 3})


def test_a_released_adapter_frees_its_slot():
    slots = LoRASlots(2)
    slots.assign([A, B], pinned=set())
    assert slots.release(1) == 0 and slots.release(1) is None
    assert slots.assign([D], pinned={2, 4}) == ({4: 0}, [(0, D)])
