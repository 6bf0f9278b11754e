"""Sleep mode (vLLM's enable_sleep_mode, LLM.sleep / wake_up): an engine gives back the device memory of its KV cache
and weights and takes them back without a restart, and then generates exactly what it generated before.

Oracle: the same engine's greedy tokens before it slept (the control), and its own memory report (bytes held by the
weights and the KV cache). Requests sent while it sleeps wait for wake_up, as vLLM's paused engine holds them."""

from __future__ import annotations

import asyncio

import pytest

from railyard.engine.client.process import EngineProcessClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.llm import LLM
from railyard.errors import InvalidRequestError

PROMPTS = [[(5 * i + n) % 250 for i in range(n)] for n in (3, 11, 24, 40)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
ENGINE = dict(device="cpu", max_model_len=128, num_gpu_blocks=64, enable_sleep_mode=True)


def _tokens(llm: LLM) -> list[list[int]]:
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def llm(tiny_model):
    llm = LLM(tiny_model, **ENGINE)
    yield llm
    llm.engine.shutdown()


@pytest.mark.parametrize("level", [1, 2])
def test_greedy_tokens_after_sleep_and_wake_up_equal_the_tokens_before(llm, level):
    before = _tokens(llm)
    llm.sleep(level)
    assert llm.is_sleeping()
    llm.wake_up()
    assert not llm.is_sleeping()
    assert _tokens(llm) == before


@pytest.mark.parametrize("level", [1, 2])
def test_while_asleep_the_memory_report_holds_no_kv_cache_and_no_device_weights(llm, level):
    awake = llm.engine.device_memory()
    assert awake["kv_cache"] > 0 and awake["weights"] > 0 and awake["host_weights"] == 0
    llm.sleep(level)
    asleep = llm.engine.device_memory()
    llm.wake_up()
    assert asleep["kv_cache"] == 0 and asleep["weights"] == 0
    if level == 1:  # every weight waits in host memory
        assert asleep["host_weights"] == awake["weights"]
    else:  # only the buffers (rotary tables) are kept: the parameters come from the checkpoint again
        assert 0 < asleep["host_weights"] < awake["weights"]
    assert llm.engine.device_memory() == awake  # the KV cache has its blocks back, all of them


def test_waking_up_reallocates_the_same_number_of_kv_blocks_and_empties_the_prefix_cache(llm):
    _tokens(llm)
    blocks = llm.engine.stats().num_total_blocks
    hits = llm.engine.stats().prefix_cache_hits
    _tokens(llm)  # the same prompts again: their full blocks are prefix-cache hits
    assert llm.engine.stats().prefix_cache_hits > hits
    llm.sleep(1)
    llm.wake_up()
    hits = llm.engine.stats().prefix_cache_hits
    _tokens(llm)
    assert llm.engine.stats().prefix_cache_hits == hits  # the cached blocks' contents went with the cache
    assert llm.engine.stats().num_total_blocks == blocks


def test_wake_up_by_tags_restores_weights_then_kv_cache(llm):
    before = _tokens(llm)
    llm.sleep(1)
    llm.wake_up(["weights"])
    memory = llm.engine.device_memory()
    assert memory["weights"] > 0 and memory["kv_cache"] == 0
    assert llm.is_sleeping()  # half awake serves nothing
    llm.wake_up(["kv_cache"])
    assert not llm.is_sleeping()
    assert _tokens(llm) == before


def test_sleep_is_refused_while_a_request_is_running_or_waiting(llm):
    engine = llm.engine
    engine.add_request("busy", None, GREEDY, prompt_token_ids=PROMPTS[0])
    with pytest.raises(InvalidRequestError, match="1 requests are running or waiting"):
        engine.sleep(1)
    engine.step()  # running now
    with pytest.raises(InvalidRequestError, match="running or waiting"):
        engine.sleep(1)
    assert not engine.is_sleeping()
    while engine.has_unfinished_requests():
        engine.step()
    engine.sleep(1)  # once it finished
    engine.wake_up()


def test_bad_sleep_requests_are_refused_with_what_to_do(llm, tiny_model):
    with pytest.raises(InvalidRequestError, match="sleep level must be 1"):
        llm.sleep(3)
    with pytest.raises(InvalidRequestError, match="tags must be some of weights, kv_cache"):
        llm.wake_up(["optimizer"])
    llm.sleep(1)
    with pytest.raises(InvalidRequestError, match="call wake_up"):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="asleep .level 1. already"):
        llm.sleep(2)
    llm.wake_up()
    off = LLM(tiny_model, **{**ENGINE, "enable_sleep_mode": False})
    with pytest.raises(InvalidRequestError, match="--enable-sleep-mode"):
        off.sleep(1)
    off.engine.shutdown()


async def _final_tokens(stream) -> list[int]:
    return [out async for out in stream][-1].outputs[0].token_ids


def test_a_request_sent_to_a_sleeping_engine_process_waits_and_is_served_after_wake_up(tiny_model):
    async def main() -> tuple[list[int], list[int], int]:
        client = EngineProcessClient(EngineConfig(model=tiny_model, **ENGINE))
        await client.start()
        try:
            control = await _final_tokens(await client.add_request("control", None, GREEDY,
                                                                   prompt_token_ids=PROMPTS[2]))
            await client.sleep(2)
            stream = await client.add_request("late", None, GREEDY, prompt_token_ids=PROMPTS[2])
            assert await client.is_sleeping()  # a call behind the add: its answer comes after the stats that count it
            assert (await client.device_memory())["kv_cache"] == 0
            waiting = client.stats.num_waiting
            assert client.stats.sleep_level == 2
            await client.wake_up()
            late = await _final_tokens(stream)
            return control, late, waiting
        finally:
            await client.shutdown()

    control, late, waiting = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert waiting == 1
    assert late == control


@pytest.mark.slow  # spawns a tensor-parallel worker process
@pytest.mark.parametrize("level", [1, 2])
def test_tensor_parallel_ranks_sleep_and_wake_up_together(tiny_model, level):
    llm = LLM(tiny_model, tensor_parallel_size=2, block_size=8, **ENGINE)
    try:
        before = _tokens(llm)
        llm.sleep(level)
        assert llm.engine.device_memory()["kv_cache"] == 0  # rank 0's shard
        llm.wake_up()
        assert _tokens(llm) == before
    finally:
        llm.engine.shutdown()
