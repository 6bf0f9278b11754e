"""Standby engines (serve/standby.py), the pool itself, without Ray: a replica's engine comes from the pool (a
sleeping one when there is one: no process is started for it), the pool refills behind a claim only while the
GPU's slots allow, an engine given back waits asleep for the next replica, and shutdown leaves no process."""

from __future__ import annotations

import asyncio

from railyard.engine.client.process import EngineProcessClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.serve.standby import StandbyPool

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


async def _settle(pool: StandbyPool) -> dict[str, int]:
    while pool.counts()["starting"] or (pool._refill is not None and not pool._refill.done()):
        await asyncio.sleep(0.05)
    return pool.counts()


def test_replicas_take_sleeping_engines_the_pool_refills_within_its_slots_and_shutdown_stops_them(tiny_model):
    config = EngineConfig(model=tiny_model, device="cpu", max_model_len=128, num_gpu_blocks=64, enable_sleep_mode=True)

    async def main():
        pool = StandbyPool(config, standby=1, slots=2)
        first = await pool.claim()  # nothing ready yet: started now, as a replica without a pool would
        assert await _settle(pool) == {"ready": 1, "claimed": 1, "starting": 0}
        ready_pid = pool._ready[0].pid
        second = await pool.claim()
        assert second.pid == ready_pid  # the sleeping one: no new process
        assert await _settle(pool) == {"ready": 0, "claimed": 2, "starting": 0}  # two slots, both held
        replica = await asyncio.to_thread(EngineProcessClient, config, handoff=second)
        await replica.start()
        await replica.wake_up()
        out = [o async for o in await replica.add_request("r", None, GREEDY, prompt_token_ids=[1, 2, 3])][-1]
        await replica.sleep(1)
        await pool.give_back(await replica.detach())  # the replica leaves: its engine waits asleep
        assert await _settle(pool) == {"ready": 1, "claimed": 1, "starting": 0}
        processes = list(pool._processes.values())
        await pool.shutdown()
        return out, first, processes

    out, first, processes = asyncio.run(asyncio.wait_for(main(), timeout=180))
    assert len(out.outputs[0].token_ids) == 8
    assert len(processes) == 2 and first.pid in {p.pid for p in processes}
    assert all(p.exitcode is not None for p in processes)  # none left behind
