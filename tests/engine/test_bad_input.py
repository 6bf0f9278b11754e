"""Bad input gets a clear error naming what is wrong; one bad request never harms the others."""

from __future__ import annotations

import json

import pytest

from railyard import LLM, EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.errors import ConfigError, InvalidRequestError, ModelLoadError


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(EngineConfig(model=tiny_model, max_model_len=64))


def test_prompt_longer_than_max_model_len_is_refused_with_both_lengths(engine):
    with pytest.raises(InvalidRequestError, match="prompt has 80 tokens but max_model_len is 64"):
        engine.add_request("long", None, SamplingParams(), prompt_token_ids=[1] * 80)
    assert engine.num_requests == 0


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_k=-5), "top_k must be"),
    (dict(min_p=1.5), "min_p must be in [0, 1]"),
    (dict(n=0), "n must be an integer"),
    (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
    (dict(logprobs=50), "logprobs must be an integer in [0, 20]"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens (5) must not exceed max_tokens (2)"),
    (dict(stop=[""]), "stop must be a list of non-empty strings"),
])
def test_bad_sampling_values_are_refused_with_the_field_named(kwargs, fragment):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert fragment in str(err.value)


@pytest.mark.parametrize("prompt_ids, fragment", [
    ([], "the prompt is empty"),
    ([5, 999999], "outside the vocabulary"),
    ([1, "x"], "must be integers"),
])
def test_malformed_prompts_are_refused(engine, prompt_ids, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        engine.add_request("bad", None, SamplingParams(), prompt_token_ids=prompt_ids)


def test_one_bad_request_never_harms_the_others_in_the_batch(engine):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    engine.add_request("good-1", None, params, prompt_token_ids=[1, 2, 3])
    with pytest.raises(InvalidRequestError):
        engine.add_request("bad", None, params, prompt_token_ids=[1] * 100)
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("good-1", None, params, prompt_token_ids=[4])
    engine.add_request("good-2", "hello", params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert sorted(finished) == ["good-1", "good-2"]
    assert all(len(o.outputs[0].token_ids) == 5 for o in finished.values())
    engine.check_invariants()


def test_abort_in_any_state_frees_blocks(engine):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"a{i}", None, params, prompt_token_ids=[i + 1] * 20)
    engine.step()
    assert engine.abort("a0") and engine.abort("a3")
    assert not engine.abort("never-existed")
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_invariants()
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_missing_model_dir_says_so(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(str(tmp_path / "nope"))


def test_hub_id_without_local_copy_says_weights_must_be_on_disk():
    with pytest.raises(ModelLoadError, match="never downloads weights"):
        LLM("Qwen/Qwen2-7B-Instruct")


def test_dir_without_config_json_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LLM(str(tmp_path))


def test_malformed_config_json_is_reported(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        LLM(str(tmp_path))


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        LLM(str(tmp_path))


def test_checkpoint_missing_weights_names_them(tmp_path, tiny_model):
    import shutil

    from safetensors.torch import load_file, save_file

    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_model}/{f}", tmp_path / f)
    tensors = load_file(f"{tiny_model}/model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        LLM(str(tmp_path))


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(block_size=12), "block_size must be 8, 16 or 32"),
    (dict(max_num_seqs=0), "max_num_seqs must be a positive integer"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(preemption_mode="drop"), "preemption_mode"),
    (dict(dtype="float8"), "dtype must be one of"),
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold must be an integer >= 0"),
    (dict(max_prefill_tokens_with_decodes=-5), "max_prefill_tokens_with_decodes must be an integer >= 0"),
])
def test_bad_engine_options_are_refused(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        EngineConfig(model="x", **kwargs)


def test_max_model_len_beyond_the_model_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings"):
        LLM(tiny_model, max_model_len=100_000)


def test_kv_pool_smaller_than_one_max_length_sequence_is_refused_with_the_length_it_holds(tiny_model):
    with pytest.raises(ConfigError, match="fewer than max_model_len 256: --max-model-len 32 fits"):
        LLM(tiny_model, num_gpu_blocks=2, max_model_len=256)


def test_a_kv_pool_too_small_is_refused_before_graphs_and_warm_up_spend_the_start(tiny_model, monkeypatch):
    from railyard.engine.runner.model_runner import ModelRunner

    def spent(*args, **kwargs):
        raise AssertionError("the start went on past the KV cache's sizing")

    monkeypatch.setattr(ModelRunner, "_profile_num_blocks", lambda self: 2)  # what the memory profile left
    monkeypatch.setattr(ModelRunner, "_capture_graphs", spent)
    monkeypatch.setattr(ModelRunner, "_allocate_kv_cache", spent)
    with pytest.raises(ConfigError, match="fewer than max_model_len 256: --max-model-len 32 fits"):
        LLM(tiny_model, max_model_len=256)


def test_a_tensor_parallel_engine_refuses_a_kv_pool_too_small_without_hanging(tiny_model):
    with pytest.raises(ConfigError, match="fewer than max_model_len 256: --max-model-len 32 fits"):
        LLM(tiny_model, num_gpu_blocks=2, max_model_len=256, tensor_parallel_size=2, device="cpu")
