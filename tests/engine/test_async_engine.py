"""AsyncEngine: the engine loop in the background, one async stream per request, aborts that free blocks."""

from __future__ import annotations

import asyncio

import pytest

from railyard.engine.async_engine import AsyncEngine
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.llm import LLM
from railyard.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError

ENGINE = dict(max_model_len=128, num_gpu_blocks=64, max_num_seqs=4)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


async def started(model: str, **kwargs) -> AsyncEngine:
    engine = AsyncEngine.from_config(EngineConfig(model=model, **ENGINE), **kwargs)
    await engine.start()
    return engine


def test_streams_end_with_the_same_tokens_as_offline_generate(tiny_model):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["first prompt", "a second, longer prompt", "3"]
    offline = [o.outputs[0].token_ids for o in LLM(tiny_model, **ENGINE).generate(prompts, params, use_tqdm=False)]

    async def main():
        engine = await started(tiny_model)
        async def last(request_id: str, prompt: str):
            return [out async for out in engine.generate(request_id, prompt, params)][-1]

        finals = await asyncio.gather(*(last(f"r{i}", p) for i, p in enumerate(prompts)))
        await engine.shutdown()
        return finals

    finals = run(main())
    assert [f.outputs[0].token_ids for f in finals] == offline
    assert all(f.finished for f in finals)


def test_a_cancelled_consumer_aborts_its_request_and_frees_its_blocks(tiny_model):
    async def main():
        engine = await started(tiny_model)
        stream = await engine.add_request("gone", "x" * 40, SamplingParams(max_tokens=100, ignore_eos=True))

        reading = asyncio.Event()

        async def read_forever():
            async for _ in stream:
                reading.set()

        reader = asyncio.ensure_future(read_forever())
        await reading.wait()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        stats = await engine.run_between_steps(engine.engine.stats)
        await engine.run_between_steps(engine.engine.check_invariants)
        await engine.shutdown()
        return stats

    stats = run(main())
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert stats.num_free_blocks == stats.num_total_blocks


def test_a_bad_request_is_refused_alone(tiny_model):
    async def main():
        engine = await started(tiny_model)
        good = asyncio.ensure_future(engine.add_request("good", "hello", SamplingParams(max_tokens=4, ignore_eos=True)))
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            await engine.add_request("bad", "hello", SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[9999]))
        final = [out async for out in await good][-1]
        await engine.shutdown()
        return final

    final = run(main())
    assert final.finished and len(final.outputs[0].token_ids) == 4


def test_a_full_waiting_queue_refuses_with_retry_after(tiny_model):
    async def main():
        engine = await started(tiny_model, max_waiting_requests=2, retry_after_s=3)
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        results = await asyncio.gather(*(engine.add_request(f"r{i}", "hello", params) for i in range(12)),
                                       return_exceptions=True)
        for r in results:
            if not isinstance(r, Exception):
                r.abort()
        await engine.shutdown()
        return results

    results = run(main())
    refused = [r for r in results if isinstance(r, EngineOverloadedError)]
    assert refused and all(r.retry_after_s == 3 for r in refused)
    assert len(refused) < len(results)


def test_a_dead_engine_fails_open_streams_and_new_requests(tiny_model):
    async def main():
        engine = await started(tiny_model)
        stream = await engine.add_request("r", "hello", SamplingParams(max_tokens=100, ignore_eos=True))

        def broken_step():
            raise RuntimeError("device lost")

        engine.engine.step = broken_step
        with pytest.raises(EngineDeadError, match="device lost"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await engine.add_request("later", "hello", SamplingParams())
        assert not engine.is_running
        await engine.shutdown()

    run(main())


def test_a_request_added_in_the_turn_the_engine_dies_fails_instead_of_hanging(tiny_model):
    async def main():
        engine = await started(tiny_model)

        def broken_step():
            raise RuntimeError("device lost")

        engine.engine.step = broken_step
        with pytest.raises(EngineDeadError, match="device lost"):
            await asyncio.wait_for(engine.add_request("r", "hello", SamplingParams()), timeout=30)
        await engine.shutdown()

    run(main())
