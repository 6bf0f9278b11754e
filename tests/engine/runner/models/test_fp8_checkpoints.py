"""Pre-quantized FP8 checkpoints in the layouts vLLM loads, detected from config.json, and the ones refused.

Oracles: the checkpoint's own bytes and scales (what loads must be what was written), the float
checkpoint quantized at load (a per-channel FP8 checkpoint made the same way must generate the same
tokens), and the float model's logits (a per-tensor FP8 checkpoint stays within FP8's error of them).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from railyard.bench.accuracy import build_runner, compare, prefill
from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
from railyard.engine.config import SamplingParams
from railyard.engine.runner.layers.fp8 import FP8
from railyard.engine.llm import LLM
from railyard.engine.runner.models.loader import load_model
from railyard.errors import ModelLoadError
from railyard.model.spec import read_model_spec
from tests.engine.runner.models.fp8_checkpoints import write_fp8_checkpoint

PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 17, 40)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _load(path):
    spec = read_model_spec(path)  # quantization "fp8" from its config.json: the decoder builds FP8 layers
    return spec, load_model(path, spec, torch.float32, torch.device("cpu"), TorchAttentionBackend)


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY,
                                                         use_tqdm=False)]


@pytest.fixture(scope="module")
def channel_checkpoint(tiny_models, tmp_path_factory):
    return write_fp8_checkpoint(tiny_models["qwen2"], tmp_path_factory.mktemp("ct") / "qwen2-fp8", "compressed-tensors")


@pytest.fixture(scope="module")
def per_tensor_checkpoint(tiny_models, tmp_path_factory):
    return write_fp8_checkpoint(tiny_models["llama"], tmp_path_factory.mktemp("fp8") / "llama-fp8", "fp8",
                                kv_scales={0: (0.5, 0.25), 1: (2.0, 1.5)})


def test_compressed_tensors_fp8_checkpoint_loads_its_bytes_and_channel_scales(channel_checkpoint):
    spec, model = _load(channel_checkpoint)
    assert spec.quantization == "fp8"
    from safetensors.torch import load_file

    saved = load_file(str(channel_checkpoint / "model.safetensors"))
    gate_up = model.model.layers[1].mlp.gate_up_proj
    want_w = torch.cat([saved["model.layers.1.mlp.gate_proj.weight"], saved["model.layers.1.mlp.up_proj.weight"]])
    want_s = torch.cat([saved["model.layers.1.mlp.gate_proj.weight_scale"],
                        saved["model.layers.1.mlp.up_proj.weight_scale"]]).reshape(-1)
    assert gate_up.weight.dtype == FP8 and torch.equal(gate_up.weight.view(torch.uint8), want_w.view(torch.uint8))
    assert torch.equal(gate_up.weight_scale, want_s)


def test_compressed_tensors_fp8_checkpoint_generates_what_quantizing_at_load_generates(tiny_models, channel_checkpoint):
    from_checkpoint = LLM(str(channel_checkpoint), device="cpu")  # no flag: config.json says FP8
    at_load = LLM(tiny_models["qwen2"], device="cpu", quantization="fp8")
    assert _tokens(from_checkpoint) == _tokens(at_load)


def test_vllm_fp8_per_tensor_checkpoint_expands_each_tensors_scale_and_sets_kv_scales(per_tensor_checkpoint):
    spec, model = _load(per_tensor_checkpoint)
    from safetensors.torch import load_file

    saved = load_file(str(per_tensor_checkpoint / "model.safetensors"))
    attn = model.model.layers[0].self_attn
    rows = {"q": attn.q_size, "k": attn.kv_size, "v": attn.kv_size}
    want = torch.cat([saved[f"model.layers.0.self_attn.{p}_proj.weight_scale"].expand(rows[p]) for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight_scale, want)
    assert (attn.attn.k_scale, attn.attn.v_scale) == (0.5, 0.25)
    assert (model.model.layers[1].self_attn.attn.k_scale, model.model.layers[1].self_attn.attn.v_scale) == (2.0, 1.5)


def test_vllm_fp8_per_tensor_checkpoint_stays_close_to_the_float_model(tiny_models, per_tensor_checkpoint):
    """Against the float model, with an FP8 KV cache on the checkpoint's own scales: measured worst layer
    cosine 0.9843 and mean KL 0.0222 nats (per-channel scales from the same weights: 0.9872, 0.0176);
    thresholds at about twice the error."""
    prompts = [[(5 * i + n) % 256 for i in range(n)] for n in (30, 64)]
    ref = prefill(build_runner(tiny_models["llama"], prompts, device="cpu"), prompts)
    got = prefill(build_runner(str(per_tensor_checkpoint), prompts, device="cpu", kv_cache_dtype="fp8"), prompts)
    result = compare(ref, got)
    assert min(result.layer_cosine) >= 0.97 and result.logit_kl_mean <= 0.045, result.to_dict()


def test_an_unsupported_checkpoint_fails_to_load_with_a_clear_error(tiny_models, tmp_path):
    path = tmp_path / "gptq"
    shutil.copytree(tiny_models["qwen2"], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="quantization method 'awq' is not supported; railyard loads FP8"):
        LLM(str(path), device="cpu")


def test_float8_weights_without_a_quantization_config_are_refused(channel_checkpoint, tmp_path):
    path = tmp_path / "undeclared"
    shutil.copytree(channel_checkpoint, path)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["quantization_config"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="is float8 but this model's layers are not"):
        LLM(str(path), device="cpu")
