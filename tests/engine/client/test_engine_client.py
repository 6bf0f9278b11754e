"""The EngineClient contract, for both implementations: the engine core in its own process (what serving
uses) and on a thread of this process. Outputs are deltas that reassemble to exactly what offline
generation gives; a reader that leaves frees its blocks; bad requests are refused at the door alone."""

from __future__ import annotations

import asyncio
import copy

import pytest

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.client.inproc import InProcessEngineClient
from railyard.engine.llm import LLM
from railyard.engine.client.process import EngineProcessClient
from railyard.errors import ConfigError, EngineOverloadedError, InvalidRequestError

ENGINE = dict(max_model_len=128, num_gpu_blocks=64, max_num_seqs=4)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def make_client(kind: str, model: str, **kwargs):
    config = EngineConfig(model=model, **ENGINE)
    if kind == "process":
        return EngineProcessClient(config, **kwargs)
    return InProcessEngineClient.from_config(config, **kwargs)


@pytest.fixture(params=["process", "in-process"])
def kind(request) -> str:
    return request.param


async def collect(client, request_id: str, prompt, params: SamplingParams):
    """Every output of one request, and the request reassembled from them."""
    outs = [out async for out in client.generate(request_id, prompt, params)]
    whole = copy.deepcopy(outs[0])
    for out in outs[1:]:
        whole.merge(out)
    return outs, whole


def test_delta_streams_reassemble_to_exactly_what_offline_generate_gives(tiny_model, kind):
    prompts = ["first prompt", "a second, longer prompt", "3"]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=10, stop=["e", "a"], logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=16, stop=["x"], include_stop_str_in_output=True)]
    offline = LLM(tiny_model, **ENGINE).generate(prompts, params, use_tqdm=False)

    async def main():
        client = make_client(kind, tiny_model)
        await client.start()
        results = await asyncio.gather(*(
            collect(client, f"r{i}", p, SamplingParams(**{**vars(sp), "output_kind": "delta"}))
            for i, (p, sp) in enumerate(zip(prompts, params))))
        await client.check_invariants()
        await client.shutdown()
        return results

    for (outs, whole), expected in zip(run(main()), offline):
        assert whole.finished and outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert whole.prompt_token_ids == expected.prompt_token_ids
        assert all(o.prompt_token_ids is None for o in outs[1:])  # the prompt is sent once, not per step
        for got, want in zip(whole.outputs, expected.outputs, strict=True):
            assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == \
                   (want.text, want.token_ids, want.finish_reason, want.stop_reason)
            assert (got.logprobs is None) == (want.logprobs is None)


def test_a_slow_reader_gets_merged_deltas_not_a_backlog(tiny_model, kind):
    async def main():
        client = make_client(kind, tiny_model)
        await client.start()
        stream = await client.add_request("slow", "hello", SamplingParams(
            temperature=0.0, max_tokens=40, ignore_eos=True, output_kind="delta"))
        outs = []
        async for out in stream:
            outs.append(out)
            await asyncio.sleep(0.3)  # several steps pass while this reader is busy
        await client.shutdown()
        return outs

    outs = run(main())
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 40
    assert len(outs) < 40 and max(len(o.outputs[0].token_ids) for o in outs) > 1


def test_a_reader_that_leaves_aborts_its_request_and_frees_its_blocks(tiny_model, kind):
    async def main():
        client = make_client(kind, tiny_model)
        await client.start()
        stream = await client.add_request("gone", "x" * 40, SamplingParams(max_tokens=100, ignore_eos=True))
        async for _ in stream:
            break  # closing the iterator aborts the request
        await client.check_invariants()
        for _ in range(100):
            if client.stats.num_running == 0 and client.stats.num_free_blocks == client.stats.num_total_blocks:
                break
            await asyncio.sleep(0.05)
        stats = client.stats
        await client.shutdown()
        return stats

    stats = run(main())
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert stats.num_free_blocks == stats.num_total_blocks


def test_a_bad_request_is_refused_at_the_door_alone(tiny_model, kind):
    async def main():
        client = make_client(kind, tiny_model)
        await client.start()
        good = await client.add_request("good", "hello", SamplingParams(max_tokens=4, ignore_eos=True))
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            await client.add_request("bad", "hello", SamplingParams(max_tokens=4, stop_token_ids=[9999]))
        with pytest.raises(InvalidRequestError, match="max_model_len is 128"):
            await client.add_request("long", None, SamplingParams(), prompt_token_ids=[1] * 200)
        with pytest.raises(InvalidRequestError, match="already in use"):
            await client.add_request("good", "again", SamplingParams())
        final = [out async for out in good][-1]
        await client.shutdown()
        return final

    final = run(main())
    assert final.finished and len(final.outputs[0].token_ids) == 4


def test_a_full_waiting_queue_refuses_with_retry_after(tiny_model):
    async def main():
        client = make_client("in-process", tiny_model, max_waiting_requests=2, retry_after_s=3)
        await client.start()
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        results = []
        for i in range(12):
            try:
                results.append(await client.add_request(f"r{i}", "hello", params))
            except EngineOverloadedError as exc:
                results.append(exc)
        for r in results:
            if not isinstance(r, Exception):
                r.abort()
        await client.shutdown()
        return results

    results = run(main())
    refused = [r for r in results if isinstance(r, EngineOverloadedError)]
    assert refused and all(r.retry_after_s == 3 for r in refused)
    assert len(refused) < len(results)


def test_a_stream_interval_sends_the_first_token_at_once_merges_the_rest_and_does_not_delay_the_end(tiny_model):
    # An interval far longer than the whole generation: the first output is alone (TTFT unchanged), every later
    # token arrives merged into the final output, which does not wait for the interval to pass.
    interval_s = 600.0

    async def main():
        client = make_client("in-process", tiny_model, stream_interval_s=interval_s)
        await client.start()
        stream = await client.add_request("paced", "hello", SamplingParams(
            temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1, output_kind="delta"))
        outs = [out async for out in stream]
        await client.shutdown()
        return outs

    outs = asyncio.run(asyncio.wait_for(main(), timeout=60))  # far less than the interval
    offline = LLM(tiny_model, **ENGINE).generate(["hello"], SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1), use_tqdm=False)[0].outputs[0]
    assert len(outs) == 2 and not outs[0].finished and outs[1].finished
    assert outs[0].outputs[0].token_ids + outs[1].outputs[0].token_ids == offline.token_ids
    assert outs[0].outputs[0].text + outs[1].outputs[0].text == offline.text
    assert len(outs[0].outputs[0].logprobs) + len(outs[1].outputs[0].logprobs) == 24  # one entry per token


def test_a_negative_stream_interval_is_a_config_error(tiny_model):
    with pytest.raises(ConfigError, match="stream_interval_s"):
        make_client("in-process", tiny_model, stream_interval_s=-1.0)
    with pytest.raises(ConfigError, match="stream_items_per_s"):
        make_client("in-process", tiny_model, stream_items_per_s=-1.0)


def test_with_an_items_budget_the_stream_interval_grows_with_the_live_streams(tiny_model):
    # 40 items/s for the whole client: 1 stream keeps the 50 ms floor, 4 streams get one item per 100 ms each
    # (4 / 40), and the interval falls back to the floor once they are gone.
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True, output_kind="delta")

    async def main():
        client = make_client("in-process", tiny_model, stream_interval_s=0.05, stream_items_per_s=40.0)
        await client.start()
        seen = [client.stream_interval()]
        for i in range(4):
            await client.add_request(f"r{i}", None, params, prompt_token_ids=[5, 6, 7])
            seen.append(client.stream_interval())
        for i in range(4):
            client.abort(f"r{i}")
        seen.append(client.stream_interval())
        await client.shutdown()
        return seen

    assert run(main()) == pytest.approx([0.05, 0.05, 0.05, 0.075, 0.1, 0.05])


def test_an_items_budget_alone_paces_streams_first_and_final_output_at_once(tiny_model):
    # No floor, a budget so small that the interval outlasts the generation: every stream yields its first
    # output and its final one, nothing between, and the tokens are those of offline generation.
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, output_kind="delta")

    async def main():
        client = make_client("in-process", tiny_model, stream_items_per_s=0.01)
        await client.start()

        async def read(request_id: str):
            stream = await client.add_request(request_id, "hello", params)
            return [out async for out in stream]

        outs = await asyncio.gather(*(read(f"r{i}") for i in range(3)))
        await client.shutdown()
        return outs

    offline = LLM(tiny_model, **ENGINE).generate(["hello"], SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    for outs in run(main()):
        assert len(outs) == 2 and not outs[0].finished and outs[1].finished
        assert outs[0].outputs[0].token_ids + outs[1].outputs[0].token_ids == offline.token_ids
