"""A sleeping engine core handed from one front to the next (sleep mode's standby engines): the new front takes it
over in the time of a reconnect, not a start (the same process: no new one is spawned), wakes it and gets exactly
the tokens the first front got (the control); the core stays its first owner's child, which stops it last; and a
core whose front dies while it is awake stops by itself rather than hold its device for nobody. An owner can also
spawn a core for the next front, which then waits for it as for a start of its own."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import signal
import subprocess
import sys

import pytest

from railyard.engine.client.process import CoreHandoff, EngineProcessClient, spawn_core
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.errors import InvalidRequestError, ModelLoadError

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPT = [5, 17, 42, 99, 7]


def _config(model: str) -> EngineConfig:
    return EngineConfig(model=model, device="cpu", max_model_len=128, num_gpu_blocks=64, enable_sleep_mode=True)


async def _final(stream) -> list[int]:
    return [out async for out in stream][-1].outputs[0].token_ids


def test_a_sleeping_core_handed_to_two_fronts_in_turn_serves_each_the_control_tokens(tiny_model):
    async def main():
        owner = EngineProcessClient(_config(tiny_model), standby=True)
        await owner.start()
        control = await _final(await owner.add_request("c", None, GREEDY, prompt_token_ids=PROMPT))
        with pytest.raises(InvalidRequestError, match="sleep it first"):
            await owner.detach()
        await owner.sleep(1)
        handoff, process = await owner.detach(), owner.process
        got = []
        for i in range(2):
            front = await asyncio.to_thread(EngineProcessClient, handoff.config, handoff=handoff)
            await front.start()
            assert front.process.pid == process.pid  # taken over, not spawned
            await front.wake_up()
            got.append(await _final(await front.add_request(f"r{i}", None, GREEDY, prompt_token_ids=PROMPT)))
            await front.sleep(1)
            handoff = await front.detach()
        assert process.is_alive()  # handed back asleep: it waits for the next front
        last = await asyncio.to_thread(EngineProcessClient, handoff.config, handoff=handoff)
        await last.start()
        await last.shutdown()
        await asyncio.to_thread(process.join, 30)
        return control, got, process.exitcode

    control, got, exitcode = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert got == [control, control]
    assert exitcode == 0


def test_a_front_that_wakes_on_join_asks_for_the_wake_up_before_it_waits_for_its_tokenizer(tiny_model, monkeypatch):
    """The core's wake-up runs beside the front's tokenizer load, not after it: the wake-up is on its way to the core
    by the time the front waits for its tokenizer, and the front's first wake_up() returns that wake-up's times
    (the engine woke once) and serves the control tokens."""
    from railyard.engine.client import process as process_module

    sent: list[str] = []  # the utility calls this process sends its cores, in order
    asked_before_tokenizer: list[bool] = []

    class Recording:
        def encode(self, msg):
            sent.append(getattr(msg, "method", type(msg).__name__))
            return encoder.encode(msg)

    def tokenizer_result(prefetch, path):
        asked_before_tokenizer.append("wake_up" in sent)
        return result(prefetch, path)

    encoder, result = process_module.encoder, process_module._TokenizerPrefetch.result
    monkeypatch.setattr(process_module, "encoder", Recording())
    monkeypatch.setattr(process_module._TokenizerPrefetch, "result", tokenizer_result)

    async def main():
        owner = EngineProcessClient(_config(tiny_model), standby=True)
        await owner.start()
        control = await _final(await owner.add_request("c", None, GREEDY, prompt_token_ids=PROMPT))
        await owner.sleep(1)
        handoff = await owner.detach()
        asked_before_tokenizer.clear()
        front = await asyncio.to_thread(EngineProcessClient, handoff.config, handoff=handoff, wake_on_join=True)
        await front.start()
        woke = await front.wake_up()
        again = await front.wake_up()  # awake already: the core has nothing to do
        tokens = await _final(await front.add_request("r", None, GREEDY, prompt_token_ids=PROMPT))
        await front.shutdown()
        return control, woke, again, tokens

    control, woke, again, tokens = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert asked_before_tokenizer == [True]
    assert sent.count("wake_up") == 2  # the early one, and the second call's
    assert woke is not None and "phases_s" in woke and again is None
    assert tokens == control


_TAKE_OVER = """
import asyncio, pickle, sys
from railyard.engine.client.process import CoreHandoff, EngineProcessClient, spawn_core

async def main():
    handoff = pickle.load(open(sys.argv[1], "rb"))
    front = EngineProcessClient(handoff.config, handoff=handoff)
    await front.start()
    await front.wake_up()
    print("awake", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_core_whose_front_dies_while_it_is_awake_stops(tiny_model, tmp_path):
    async def main():
        owner = EngineProcessClient(_config(tiny_model), standby=True)
        await owner.start()
        await owner.sleep(1)
        handoff, process = await owner.detach(), owner.process
        (tmp_path / "handoff").write_bytes(pickle.dumps(handoff))
        front = subprocess.Popen([sys.executable, "-c", _TAKE_OVER, str(tmp_path / "handoff")],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert front.stdout.readline().strip() == "awake"
            assert process.is_alive()
            front.send_signal(signal.SIGKILL)
            front.wait(30)
            await asyncio.to_thread(process.join, 60)
            return process.exitcode
        finally:
            if front.poll() is None:
                front.kill()
                front.wait(30)
            if process.is_alive():
                process.kill()
                process.join(10)

    assert asyncio.run(asyncio.wait_for(main(), timeout=120)) == 0  # it stopped by itself, cleanly


def test_a_core_started_for_a_front_by_its_owner_serves_it_from_its_start_or_fails_with_the_start_up_error(
        tiny_model, tmp_path):
    """An owner with no sleeping core spawns one for the next front (spawn_core; a handoff without Ready): the front
    waits for its Ready as after a spawn of its own, and it is awake (nothing to wake); a start that fails raises the
    start's own error in the front."""
    async def main():
        config = _config(tiny_model)
        (tmp_path / "ok").mkdir()
        process = spawn_core(config, str(tmp_path / "ok"), standby=True)
        front = await asyncio.to_thread(EngineProcessClient, config, handoff=CoreHandoff(config, process.pid,
                                                                                         str(tmp_path / "ok")))
        await front.start()
        try:
            woke = await front.wake_up()
            tokens = await _final(await front.add_request("r", None, GREEDY, prompt_token_ids=PROMPT))
        finally:
            await front.shutdown()
        await asyncio.to_thread(process.join, 30)
        bad = dataclasses.replace(config, model=str(tmp_path / "no-such-model"))
        (tmp_path / "bad").mkdir()
        failing = spawn_core(bad, str(tmp_path / "bad"), standby=True)
        with pytest.raises(ModelLoadError):
            await asyncio.to_thread(EngineProcessClient, bad, handoff=CoreHandoff(bad, failing.pid,
                                                                                str(tmp_path / "bad")))
        await asyncio.to_thread(failing.join, 30)
        return woke, tokens, process.exitcode, failing.exitcode

    woke, tokens, exitcode, failed = asyncio.run(asyncio.wait_for(main(), timeout=120))
    assert woke is None and len(tokens) == 12
    assert exitcode == 0 and failed is not None
