"""LoRA adapters through the EngineClient, for both implementations (the engine process, over wire.py, and the
in-process core): load, list and unload between steps; requests name a loaded adapter beside base-model requests and
get what offline generation gives; a bad adapter is refused (InvalidRequestError, the front's 400) while a running
request goes on undisturbed; an adapter that is not loaded is its own error (UnknownLoRAError, the front's 404)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from railyard.engine.client.inproc import InProcessEngineClient
from railyard.engine.client.process import EngineProcessClient
from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.lora.request import LoRARequest
from railyard.errors import InvalidRequestError, UnknownLoRAError
from tests.engine.lora.adapters import write_adapter

ENGINE = dict(max_model_len=128, num_gpu_blocks=64, max_num_seqs=4, enable_lora=True, max_loras=2, max_lora_rank=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)  # long enough to overlap a load
PROMPT = [5, 17, 42, 99, 3, 8]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=180))


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> dict[str, LoRARequest]:
    root = tmp_path_factory.mktemp("client-adapters")
    qwen2 = tiny_models["qwen2"]
    return {
        "a": LoRARequest("a", 1, write_adapter(qwen2, root / "a", seed=1, r=8, lora_alpha=16,
                                               target_modules=["q_proj", "v_proj"])),
        "b": LoRARequest("b", 2, write_adapter(qwen2, root / "b", seed=2, r=16, lora_alpha=16,
                                               target_modules=["gate_proj", "down_proj"])),
        "wrong-model": LoRARequest("wrong-model", 3, write_adapter(tiny_models["qwen3"], root / "w", r=8,
                                                                   lora_alpha=8, target_modules=["q_proj"])),
        "rank-32": LoRARequest("rank-32", 4, write_adapter(qwen2, root / "r", r=32, lora_alpha=8,
                                                           target_modules=["o_proj"])),
        "missing": LoRARequest("missing", 5, str(root / "nowhere")),
        "pickle": LoRARequest("pickle", 6, str(_pickled(root / "p"))),
    }


def _pickled(path):
    path.mkdir()
    (path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "lora_alpha": 8}')
    torch.save({"x": torch.zeros(1)}, path / "adapter_model.bin")
    return path


@pytest.fixture(scope="module")
def offline(tiny_models, adapters) -> dict[str | None, list[int]]:
    """What offline generation gives for PROMPT under each adapter and the base model."""
    llm = LLM(tiny_models["qwen2"], **ENGINE)
    names = ["a", "b", None]
    outs = llm.generate(prompt_token_ids=[PROMPT] * 3, sampling_params=GREEDY, use_tqdm=False,
                        lora_request=[adapters[n] if n else None for n in names])
    return {n: o.outputs[0].token_ids for n, o in zip(names, outs)}


@pytest.fixture(params=["process", "in-process"])
def kind(request) -> str:
    return request.param


def make_client(kind: str, model: str):
    config = EngineConfig(model=model, **ENGINE)
    return EngineProcessClient(config) if kind == "process" else InProcessEngineClient.from_config(config)


async def tokens(client, request_id: str, lora: LoRARequest | None, params: SamplingParams = GREEDY) -> list[int]:
    stream = await client.add_request(request_id, None, params, prompt_token_ids=PROMPT, lora=lora)
    out = None
    async for out in stream:
        pass
    return out.outputs[0].token_ids


def test_loaded_adapters_serve_beside_the_base_model_and_are_listed(tiny_models, adapters, offline, kind):
    async def main():
        client = make_client(kind, tiny_models["qwen2"])
        await client.start()
        assert client.model_info.loras == [] and client.model_info.max_loras == 2
        await client.load_lora(adapters["a"])
        await client.load_lora(adapters["b"])
        assert [r.lora_name for r in client.model_info.loras] == ["a", "b"]
        assert await client.list_loras() == [adapters["a"], adapters["b"]]
        got = await asyncio.gather(tokens(client, "ra", client.lora_request("a")),
                                   tokens(client, "rb", adapters["b"]), tokens(client, "base", None))
        await client.unload_lora("a")
        assert await client.list_loras() == [adapters["b"]]
        await client.check_invariants()
        await client.shutdown()
        return got

    assert run(main()) == [offline["a"], offline["b"], offline[None]]


@pytest.mark.parametrize("bad, why", [("wrong-model", "do not fit this model"), ("rank-32", "over max_lora_rank"),
                                      ("missing", "is not a directory"), ("pickle", "is a pickle")])
def test_a_bad_adapter_is_refused_and_a_running_request_goes_on_undisturbed(tiny_models, adapters, offline, kind,
                                                                             bad, why):
    async def main():
        client = make_client(kind, tiny_models["qwen2"])
        await client.start()
        await client.load_lora(adapters["a"])
        running = asyncio.create_task(tokens(client, "ra", adapters["a"]))
        await asyncio.sleep(0.05)
        with pytest.raises(InvalidRequestError, match=why):
            await client.load_lora(adapters[bad])
        got = await running
        assert [r.lora_name for r in await client.list_loras()] == ["a"]
        assert client.is_running
        await client.shutdown()
        return got

    assert run(main()) == offline["a"]


def test_an_adapter_that_is_not_loaded_is_an_unknown_lora_error(tiny_models, adapters, kind):
    async def main():
        client = make_client(kind, tiny_models["qwen2"])
        await client.start()
        with pytest.raises(UnknownLoRAError, match="no LoRA adapter named 'b'"):
            await client.add_request("r", None, GREEDY, prompt_token_ids=PROMPT, lora=adapters["b"])
        with pytest.raises(UnknownLoRAError):
            client.lora_request("b")
        with pytest.raises(UnknownLoRAError):
            await client.unload_lora("b")
        # Unloaded on its way to the core: the door let it through, the core refuses it with the same error type.
        await client.load_lora(adapters["a"])
        unload = asyncio.create_task(client.unload_lora("a"))
        await asyncio.sleep(0)
        with pytest.raises(UnknownLoRAError):
            await tokens(client, "late", adapters["a"])
        await unload
        assert client.is_running
        await client.shutdown()

    run(main())


def test_an_engine_without_lora_refuses_adapters_as_bad_requests(tiny_model, adapters):
    async def main():
        client = InProcessEngineClient.from_config(EngineConfig(model=tiny_model, max_model_len=128,
                                                                num_gpu_blocks=64))
        await client.start()
        with pytest.raises(InvalidRequestError, match="--enable-lora"):
            await client.load_lora(adapters["a"])
        with pytest.raises(InvalidRequestError, match="--enable-lora"):
            await client.add_request("r", None, GREEDY, prompt_token_ids=PROMPT, lora=adapters["a"])
        await client.shutdown()

    run(main())
