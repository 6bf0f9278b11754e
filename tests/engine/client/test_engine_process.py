"""The engine core in its own process: it reports start-up failures as the user's errors, within seconds;
a core that dies fails every open stream and every new request at once; shutdown leaves no process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.client.process import EngineProcessClient
from railyard.errors import ConfigError, EngineDeadError, ModelLoadError


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def test_a_kv_cache_that_cannot_hold_max_model_len_fails_start_up_with_a_config_error(tiny_model):
    started = time.monotonic()
    with pytest.raises(ConfigError, match="fewer than max_model_len"):
        EngineProcessClient(EngineConfig(model=tiny_model, max_model_len=512, num_gpu_blocks=4))
    assert time.monotonic() - started < 60


def test_a_checkpoint_that_does_not_load_fails_start_up_with_a_model_load_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises((ModelLoadError, ConfigError)):
        EngineProcessClient(EngineConfig(model=str(tmp_path)))


def test_a_killed_core_fails_open_streams_and_new_requests_and_leaves_nothing_behind(tiny_model):
    async def main():
        client = EngineProcessClient(EngineConfig(model=tiny_model, max_model_len=256, num_gpu_blocks=64))
        await client.start()
        stream = await client.add_request("r", "hello", SamplingParams(max_tokens=200, ignore_eos=True))
        got = 0
        with pytest.raises(EngineDeadError, match="killed by SIGKILL"):
            async for _ in stream:
                got += 1
                if got == 2:
                    os.kill(client.pid, signal.SIGKILL)
        assert not client.is_running
        with pytest.raises(EngineDeadError):
            await client.add_request("later", "hello", SamplingParams())
        await client.shutdown()
        return client

    client = run(main())
    assert client.process.exitcode == -signal.SIGKILL


def test_shutdown_stops_the_core_process(tiny_model):
    async def main():
        client = EngineProcessClient(EngineConfig(model=tiny_model, max_model_len=128, num_gpu_blocks=64))
        await client.start()
        assert client.is_running and client.model_info.pids == [client.pid]
        final = [o async for o in client.generate("r", "hi", SamplingParams(max_tokens=3, ignore_eos=True))][-1]
        await client.shutdown()
        return client, final

    client, final = run(main())
    assert final.finished and not client.process.is_alive() and client.process.exitcode == 0


def test_the_engine_process_takes_its_torch_threads_from_the_config_and_leaves_a_core_to_the_front_by_default():
    import torch

    from railyard.engine.core.process import _set_torch_threads

    before = torch.get_num_threads()
    try:
        _set_torch_threads(EngineConfig(device="cpu", torch_threads=1))
        assert torch.get_num_threads() == 1
        _set_torch_threads(EngineConfig(device="cpu"))
        assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    finally:
        torch.set_num_threads(before)
