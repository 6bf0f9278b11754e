"""LoRA adapters through the OpenAI API, as vLLM serves them: --lora-modules at start, /v1/models listing each with
its parent, a request's `model` naming one, runtime load/unload behind an explicit flag and the API key, 404 for an
unknown adapter, 400 for a bad one with nothing running disturbed. The official openai client against real uvicorn;
what an adapter generates is checked against HF transformers + peft."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.api.conftest import MODEL_NAME, serve_in_thread, tiny_engine
from tests.engine.lora.adapters import peft_greedy, write_adapter

from railyard.api.lora import LoRAModule, lora_int_id, parse_lora_module
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.errors import ConfigError

KEY = "s3cret"
PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "attn": write_adapter(tiny_model, root / "attn", seed=1, r=8, lora_alpha=16,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        "mlp": write_adapter(tiny_model, root / "mlp", seed=2, r=16, lora_alpha=8,
                             target_modules=["gate_proj", "up_proj", "down_proj"]),
        "late": write_adapter(tiny_model, root / "late", seed=3, r=4, lora_alpha=8, target_modules=["v_proj"]),
    }


@pytest.fixture(scope="module")
def lora_server(tiny_model, adapters):
    engine = tiny_engine(tiny_model, enable_lora=True, max_loras=2, max_lora_rank=16)
    modules = [LoRAModule("attn", adapters["attn"]), LoRAModule("mlp", adapters["mlp"], MODEL_NAME)]
    with serve_in_thread(engine, lora_modules=modules, lora_runtime_updates=True, api_key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def client(lora_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=lora_server.url + "/v1", api_key=KEY, max_retries=0)


def _greedy(client: openai.OpenAI, model: str, max_tokens: int = 8) -> list[int]:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                    logprobs=0, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert out.model == model
    return [int(t.removeprefix("token_id:")) for t in out.choices[0].logprobs.tokens]


def _load(client: openai.OpenAI, name: str, path: str) -> str:
    return client.post("/load_lora_adapter", body={"lora_name": name, "lora_path": path}, cast_to=str)


def _unload(client: openai.OpenAI, name: str) -> str:
    return client.post("/unload_lora_adapter", body={"lora_name": name}, cast_to=str)


# -- serving adapters ---------------------------------------------------------------------------------------------
def test_models_lists_each_adapter_with_its_parent_and_its_path(client, adapters):
    cards = {m.id: m for m in client.models.list().data}
    assert cards[MODEL_NAME].parent is None
    for name in ("attn", "mlp"):
        assert cards[name].parent == MODEL_NAME and cards[name].root == adapters[name]
    assert client.models.retrieve("attn").parent == MODEL_NAME


def test_a_request_naming_an_adapter_generates_what_peft_generates_with_it(client, tiny_model, adapters):
    for name in ("attn", "mlp"):
        assert _greedy(client, name) == peft_greedy(tiny_model, adapters[name], [PROMPT], 8)[0]
    assert _greedy(client, MODEL_NAME) == peft_greedy(tiny_model, None, [PROMPT], 8)[0]


def test_chat_completions_name_the_adapter_too(client):
    reply = client.chat.completions.create(model="attn", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.model == "attn" and reply.choices[0].message.content is not None


def test_an_unknown_adapter_is_a_404_with_an_openai_body(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and "no-such-adapter" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-adapter")


# -- runtime updates ----------------------------------------------------------------------------------------------
def test_an_adapter_loaded_at_runtime_is_served_listed_and_then_unloaded(client, tiny_model, adapters):
    assert _load(client, "late", adapters["late"]) == "Success: LoRA adapter 'late' added successfully."
    assert {m.id for m in client.models.list().data} >= {"late"}
    assert _greedy(client, "late") == peft_greedy(tiny_model, adapters["late"], [PROMPT], 8)[0]
    assert _unload(client, "late") == "Success: LoRA adapter 'late' removed successfully."
    assert "late" not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="late", prompt="hi", max_tokens=2)


def test_loading_a_name_already_served_is_a_400(client, adapters):
    with pytest.raises(openai.BadRequestError, match="has already been loaded"):
        _load(client, "attn", adapters["mlp"])
    with pytest.raises(openai.BadRequestError, match="served model"):
        _load(client, MODEL_NAME, adapters["mlp"])


def test_unloading_an_unknown_adapter_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        _unload(client, "never-loaded")


def test_runtime_updates_need_the_api_key(lora_server, adapters):
    refused = httpx.post(lora_server.url + "/v1/load_lora_adapter",
                         json={"lora_name": "x", "lora_path": adapters["late"]})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_runtime_updates_are_off_unless_the_server_was_started_with_the_flag(server, adapters):
    plain = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for call in (lambda: _load(plain, "x", adapters["late"]), lambda: _unload(plain, "x")):
        with pytest.raises(openai.NotFoundError, match="--enable-lora-runtime-updates"):
            call()


# -- bad adapters: a clear 400, nothing running disturbed ----------------------------------------------------------
@pytest.fixture(scope="module")
def bad_adapters(tiny_model, tmp_path_factory) -> dict[str, tuple[str, str]]:
    """{case: (adapter dir, what the 400 says)}."""
    root = tmp_path_factory.mktemp("bad-adapters")
    other = write_tiny_checkpoint(root / "other-model", intermediate_size=96)
    pickled = root / "pickled"
    write_adapter(tiny_model, pickled, r=4, target_modules=["q_proj"])
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    (root / "empty").mkdir()
    return {
        "wrong shapes": (write_adapter(str(other), root / "wrong-shapes", r=4, target_modules=["up_proj"]),
                         "do not fit this model"),
        "rank over the limit": (write_adapter(tiny_model, root / "rank-32", r=32, target_modules=["q_proj"]),
                                "max_lora_rank"),
        "missing files": (str(root / "empty"), "adapter_config.json"),
        "missing directory": (str(root / "nowhere"), "is not a directory"),
        "a pickle": (str(pickled), "pickle"),
    }


@pytest.mark.parametrize("case", ["wrong shapes", "rank over the limit", "missing files", "missing directory",
                                  "a pickle"])
def test_a_bad_adapter_is_a_clear_400_and_a_running_stream_is_undisturbed(client, bad_adapters, case):
    path, says = bad_adapters[case]
    finished: list[str | None] = []

    def stream() -> None:
        chunks = client.completions.create(model="attn", prompt=PROMPT, max_tokens=48, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        finished.extend(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)

    running = threading.Thread(target=stream)
    running.start()
    with pytest.raises(openai.BadRequestError, match=says):
        _load(client, "bad", path)
    running.join(timeout=120)
    assert not running.is_alive() and finished == ["length"]  # it ran to its token budget
    assert "bad" not in {m.id for m in client.models.list().data}
    assert _greedy(client, "attn")  # the server serves on


# -- metrics --------------------------------------------------------------------------------------------------------
def test_metrics_carry_vllms_lora_requests_info_gauge(client, lora_server):
    _greedy(client, "attn")
    text = httpx.get(lora_server.url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{"))
    assert 'max_lora="2"' in line and "running_lora_adapters=" in line and "waiting_lora_adapters=" in line


def test_a_server_without_adapters_exports_no_lora_gauge(server):
    assert "vllm:lora_requests_info" not in httpx.get(server.url + "/metrics").text


# -- --lora-modules -------------------------------------------------------------------------------------------------
def test_lora_modules_take_vllms_two_forms():
    assert parse_lora_module("sql=/adapters/sql") == LoRAModule("sql", "/adapters/sql")
    assert parse_lora_module('{"name": "sql", "path": "/a", "base_model_name": "base"}') == \
        LoRAModule("sql", "/a", "base")


@pytest.mark.parametrize("text", ["sql", "=/a", "sql=", '{"name": "sql"}', '{"name": 1, "path": "/a"}', "{oops"])
def test_a_malformed_lora_module_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--lora-modules"):
        parse_lora_module(text)


def test_an_adapters_id_is_the_same_in_every_process_and_differs_by_name_or_path():
    assert lora_int_id("sql", "/a") == lora_int_id("sql", "/a") > 0
    assert len({lora_int_id("sql", "/a"), lora_int_id("sql", "/b"), lora_int_id("chat", "/a")}) == 3


def test_an_adapter_replaced_in_place_gets_a_new_id_and_identical_files_keep_theirs(tmp_path):
    """The id keys the adapter's prefix-cache blocks: new weights at the same path must never meet the old ones'."""
    adapter = tmp_path / "sql"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    first = lora_int_id("sql", str(adapter))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")  # rewritten, same bytes, newer mtime
    assert lora_int_id("sql", str(adapter)) == first
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")
    assert lora_int_id("sql", str(adapter)) != first
