"""With LoRA adapters, the scheduler never runs more distinct adapters at once than the device has slots (a request
of another adapter waits, and requests behind it of a running adapter or the base model go first), and the prefix
cache never serves one adapter's KV blocks to another adapter or to the base model."""

from __future__ import annotations

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.lora.request import LoRARequest
from railyard.engine.sched.block_manager import BlockManager, prefix_block_hashes
from railyard.engine.sched.scheduler import Scheduler
from railyard.engine.sched.sequence import Sequence

A, B, C = (LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("abc", start=1))


def _scheduler(max_loras: int, **config) -> Scheduler:
    c = EngineConfig(model="m", enable_lora=True, max_loras=max_loras, block_size=8, **config)
    c.resolve(256)
    return Scheduler(c, BlockManager(64, 0, 8))


def _seq(i: int, lora: LoRARequest | None, prompt: list[int] | None = None) -> Sequence:
    return Sequence(i, f"r{i}", 0, prompt or [i + 1] * 5, SamplingParams(max_tokens=4), float(i), lora=lora)


def _running_adapters(sched: Scheduler) -> set[str]:
    return {s.lora.lora_name for s in sched.running if s.lora is not None}


def test_a_third_adapter_waits_while_two_slots_are_taken_and_others_go_ahead_of_it():
    sched = _scheduler(max_loras=2)
    seqs = [_seq(0, A), _seq(1, B), _seq(2, C), _seq(3, A), _seq(4, None)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert [item.seq.seq_id for item in out.scheduled] == [0, 1, 3, 4]  # C skipped, not the queue blocked
    assert _running_adapters(sched) == {"a", "b"}
    assert set(out.lora_slots) == {1, 2} and sorted(slot for slot, _ in out.lora_loads) == [0, 1]


def test_the_waiting_adapter_runs_once_a_slot_has_no_running_sequence_and_takes_that_slot():
    sched = _scheduler(max_loras=2)
    seqs = [_seq(0, A), _seq(1, B), _seq(2, C)]
    for seq in seqs:
        sched.add(seq)
    first = sched.schedule()
    sched.mark_computed(first)
    seqs[0].finish("stop")
    sched.finish(seqs[0])
    out = sched.schedule()
    assert seqs[2] in sched.running and _running_adapters(sched) == {"b", "c"}
    assert out.lora_loads == [(first.lora_slots[A.lora_int_id], C)]  # C evicted A, whose requests are done


def test_requests_of_one_adapter_share_its_slot_however_many_run():
    sched = _scheduler(max_loras=1)
    for i in range(4):
        sched.add(_seq(i, A))
    out = sched.schedule()
    assert len(out.scheduled) == 4 and out.lora_slots == {1: 0} and out.lora_loads == [(0, A)]


def test_prefix_hash_chains_differ_per_adapter_and_from_the_base_model():
    tokens = list(range(32))
    chains = [prefix_block_hashes(tokens, 8, lora_id) for lora_id in (0, 1, 2)]
    assert len(set().union(*chains)) == 3 * 4  # no block of one chain in another


def test_a_prompt_cached_under_one_adapter_is_not_a_hit_for_another():
    bm = BlockManager(32, 0, 8)
    prompt = list(range(40))
    first = _seq(0, A, prompt)
    bm.admit(first, [], len(prompt))
    first.num_computed_tokens = len(prompt)
    bm.cache_full_blocks(first)
    assert len(bm.find_cached_prefix(_seq(1, A, prompt))) == 4
    assert bm.find_cached_prefix(_seq(2, B, prompt)) == []
    assert bm.find_cached_prefix(_seq(3, None, prompt)) == []
