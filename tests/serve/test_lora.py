"""LoRA adapters on real Ray: a stack file's model with two replicas and two adapters, deployed as `railyard serve
--config` does. Requests naming an adapter go to a replica that holds it and spill to the other when it is busy
(each replica loads an adapter at its first request there); what they generate is what HF transformers + peft
generate; /v1/models lists the adapters under their parent and /metrics carries vLLM's vllm:lora_requests_info."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest
from ray import serve

from railyard.api.lora import lora_request
from railyard.engine.config import SamplingParams
from railyard.engine.tokenizer import load_tokenizer
from railyard.model.spec import read_model_spec
from railyard.serve.client import PoolHandle, RayEngineClient
from railyard.serve.launch import deploy
from railyard.stack import deployment_name, parse_stack, to_serve_config
from tests.engine.lora.adapters import peft_greedy, write_adapter

pytestmark = pytest.mark.timeout(600)
APP = "lora-ray"
PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ray-adapters")
    return {"attn": write_adapter(tiny_model, root / "attn", seed=1, r=8, lora_alpha=16,
                                  target_modules=["q_proj", "v_proj", "o_proj"]),
            "mlp": write_adapter(tiny_model, root / "mlp", seed=2, r=16, lora_alpha=8,
                                 target_modules=["gate_proj", "down_proj"])}


@pytest.fixture(scope="module")
def base_url(serve_cluster, tiny_model, adapters):
    stack = parse_stack({"name": APP, "image": "railyard:test", "models": [
        {"name": "tiny", "model": tiny_model, "num_replicas": 2,
         "engine": {"max_model_len": 1024, "dtype": "float32", "max_num_seqs": 16, "max_loras": 2,
                    "max_lora_rank": 16},
         "lora": {"adapters": [{"name": n, "path": p} for n, p in adapters.items()]}}]})
    deploy(to_serve_config(stack), cpu=True, timeout_s=300)
    yield serve_cluster.http_url
    serve.delete(APP)


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engines(base_url, tiny_model, adapters) -> RayEngineClient:
    """A client straight over the model's engine deployment (as the ingress holds one): each stream names the
    replica that served it."""
    handle = serve.get_deployment_handle(deployment_name("tiny", None), APP)
    ray_client = RayEngineClient("tiny", [PoolHandle("default", None, handle, 1024)], load_tokenizer(tiny_model),
                                 max_model_len=1024, vocab_size=read_model_spec(tiny_model).vocab_size,
                                 spec=read_model_spec(tiny_model), max_loras=2, max_lora_rank=16)
    for name, path in adapters.items():
        asyncio.run(ray_client.load_lora(lora_request(name, path)))
    return ray_client


def _greedy(client: openai.OpenAI, model: str) -> list[int]:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0,
                                    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert out.model == model
    return [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]


async def _run(engines: RayEngineClient, adapter: str | None, prompt: list[int], max_tokens: int) -> str:
    """One greedy request; the replica that served it."""
    lora = engines._loras[adapter] if adapter else None
    stream = await engines.add_request(engines.new_request_id(), None,
                                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                                       prompt_token_ids=prompt, lora=lora)
    async for _ in stream:
        pass
    return stream.replica


def test_models_lists_the_adapters_under_their_parent(client, adapters):
    cards = {m.id: m for m in client.models.list().data}
    assert cards["tiny"].parent is None
    assert {(cards[n].parent, cards[n].root) for n in adapters} == {("tiny", p) for p in adapters.values()}


def test_each_adapter_generates_what_peft_generates_with_it_through_the_proxy(client, tiny_model, adapters):
    for name, path in adapters.items():
        assert _greedy(client, name) == peft_greedy(tiny_model, path, [PROMPT], 8)[0]
    assert _greedy(client, "tiny") == peft_greedy(tiny_model, None, [PROMPT], 8)[0]


def test_an_unknown_adapter_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)


def test_an_adapters_requests_stay_on_a_replica_holding_it_then_spill_when_it_is_busy(engines):
    async def scenario() -> tuple[set[str], list[str]]:
        # One at a time: the adapter is placed on one replica and its requests follow it.
        sequential = {await _run(engines, "mlp", [9, i, 31, 4, 77, i + 1, 2, 8], 4) for i in range(6)}
        # Many long ones at once: more than the load bound lets one replica take.
        burst = await asyncio.gather(*(_run(engines, "mlp", [9, i, 13, 4, 70, i + 2, 5, 8], 96)
                                       for i in range(10)))
        return sequential, burst

    sequential, burst = asyncio.run(scenario())
    assert len(sequential) == 1, f"an adapter's one-at-a-time requests were split over {sequential}"
    (holder,) = sequential
    assert burst.count(holder) >= 5 and len(set(burst)) == 2, f"burst placement: {burst}"


def test_metrics_carry_vllms_lora_requests_info(base_url, client):
    _greedy(client, "attn")
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{"))
    assert 'max_lora="2"' in line and 'model_name="tiny"' in line
    assert re.search(r'railyard_serve_routing_decisions_total\{[^}]*reason="adapter"', text)
