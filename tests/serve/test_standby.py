"""Standby engines (serve/standby.py), the pool itself, without Ray: a replica's engine comes from the pool (a
sleeping one when there is one: no process is started for it; else one started for it, awake: one start-up, not a
start, a sleep and a wake-up), the pool refills once that engine serves and only while the GPU's slots allow, an
engine given back waits asleep for the next replica, and shutdown leaves no process."""

from __future__ import annotations

import asyncio
import os

from railyard.engine.client.process import EngineProcessClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.serve.standby import StandbyPool, standby_slots

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [1, 2, 3, 5, 8]


async def _settle(pool: StandbyPool) -> dict[str, int]:
    while pool.counts()["starting"] or (pool._refill is not None and not pool._refill.done()):
        await asyncio.sleep(0.05)
    return pool.counts()


async def _tokens(client: EngineProcessClient, request_id: str) -> list[int]:
    stream = await client.add_request(request_id, None, GREEDY, prompt_token_ids=PROMPT)
    return [o async for o in stream][-1].outputs[0].token_ids


def test_replicas_take_sleeping_engines_the_pool_refills_within_its_slots_and_shutdown_stops_them(tiny_model):
    config = EngineConfig(model=tiny_model, device="cpu", max_model_len=128, num_gpu_blocks=64, enable_sleep_mode=True)

    async def main():
        pool = StandbyPool(config, standby=1, slots=2)
        # Nothing ready: an engine started for the replica, which waits for its Ready as for a start of its own.
        first = await pool.claim()
        assert pool.counts() == {"ready": 0, "claimed": 1, "starting": 0}  # no refill while it starts
        replica1 = await asyncio.to_thread(EngineProcessClient, config, handoff=first)
        await replica1.start()
        woke = await replica1.wake_up()  # awake from its start: nothing to restore
        started = replica1.model_info.startup.phases
        control = await _tokens(replica1, "control")
        await pool.serving(first.pid)
        assert await _settle(pool) == {"ready": 1, "claimed": 1, "starting": 0}
        ready_pid = pool.engines()["ready"][0]
        second = await pool.claim()
        assert second.pid == ready_pid  # the sleeping one: no new process
        replica2 = await asyncio.to_thread(EngineProcessClient, config, handoff=second)
        await replica2.start()
        assert await replica2.wake_up() is not None  # asleep: woken (its phases)
        out = await _tokens(replica2, "r")
        await pool.serving(second.pid)
        assert await _settle(pool) == {"ready": 0, "claimed": 2, "starting": 0}  # two slots, both held
        for replica in (replica2, replica1):  # the replicas leave: their engines wait asleep
            await replica.sleep(1)
            await pool.give_back(await replica.detach())
        assert await _settle(pool) == {"ready": 2, "claimed": 0, "starting": 0}
        again = await pool.claim()  # the engine first started awake, asleep now: woken like any standby
        assert again.pid == first.pid
        replica3 = await asyncio.to_thread(EngineProcessClient, config, handoff=again)
        await replica3.start()
        assert await replica3.wake_up() is not None
        third = await _tokens(replica3, "again")
        await replica3.sleep(1)
        await pool.give_back(await replica3.detach())
        processes = list(pool._processes.values())
        await pool.shutdown()
        return woke, started, control, out, third, first, processes, [first.directory, second.directory]

    woke, started, control, out, third, first, processes, directories = asyncio.run(
        asyncio.wait_for(main(), timeout=180))
    assert woke is None and "kv_allocation" in started  # its report is a start's, and no wake-up followed
    assert len(control) == 8 and out == control and third == control
    assert len(processes) == 2 and first.pid in {p.pid for p in processes}
    assert all(p.exitcode is not None for p in processes)  # none left behind
    assert not any(os.path.exists(d) for d in directories)  # nor their sockets' directories


def test_a_gpu_holds_as_many_engines_for_a_deployment_as_its_replicas_fit_there_up_to_max_replicas():
    assert standby_slots(1, max_replicas=2, gpus=0.5) == 2  # the second replica's share: its standby waits there
    assert standby_slots(1, max_replicas=4, gpus=0.5) == 2  # never a share Ray may give another deployment
    assert standby_slots(2, max_replicas=2, gpus=0.25) == 2
    assert standby_slots(1, max_replicas=3, gpus=1 / 3) == 3  # 1 / (1/3) rounds to 3, not 2
    assert standby_slots(1, max_replicas=2, gpus=1.0) == 1  # a whole-GPU replica leaves no room for a standby
    assert standby_slots(1, max_replicas=2, gpus=0.0) == 3  # on the CPU: every replica and its standby
