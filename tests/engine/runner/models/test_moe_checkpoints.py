"""Mixture-of-experts checkpoints: FP8 ones with 128 x 128 block scales as Qwen3-30B-A3B-FP8 ships them, and a
bf16 one quantized as it loads (--quantization fp8).

Oracles: the checkpoint's own bytes and scales (the experts must hold exactly what was written), the layers'
per-channel quantization of the dequantized weight (what the other layers must hold), and the float model's
prefill (the FP8 model stays within FP8's error of it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from railyard.bench.accuracy import build_runner, compare, prefill
from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend
from railyard.engine.runner.layers.fp8 import FP8, quantize_rows
from railyard.engine.runner.layers.fp8_block import dequantize_blocks, quantize_blocks
from railyard.engine.runner.models.loader import load_model
from railyard.model.spec import read_model_spec
from tests.engine.runner.models.fp8_checkpoints import write_fp8_checkpoint

PROMPTS = [[(5 * i + n) % 256 for i in range(n)] for n in (30, 64)]


@pytest.fixture(scope="module")
def block_checkpoint(tiny_models, tmp_path_factory):
    return write_fp8_checkpoint(tiny_models["qwen3moe"], tmp_path_factory.mktemp("fp8b") / "moe-fp8", "fp8-block")


def _load(path, **precision):
    spec = read_model_spec(path).with_precision("float32", **precision, device_type="cpu")
    return load_model(path, spec, torch.float32, torch.device("cpu"), TorchAttentionBackend)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_block_fp8_experts_hold_the_checkpoints_bytes_and_block_scales(block_checkpoint):
    spec, model = read_model_spec(block_checkpoint), _load(block_checkpoint)
    assert spec.quantization == "fp8" and spec.block_scaled_checkpoint
    saved = load_file(str(block_checkpoint / "model.safetensors"))
    experts = model.model.layers[0].mlp.experts
    p = "model.layers.0.mlp.experts.5."
    assert torch.equal(_bytes(experts.w13_weight[5]),
                       _bytes(torch.cat([saved[p + "gate_proj.weight"], saved[p + "up_proj.weight"]])))
    assert torch.equal(experts.w13_weight_scale[5],
                       torch.cat([saved[p + "gate_proj.weight_scale_inv"], saved[p + "up_proj.weight_scale_inv"]]))
    assert torch.equal(_bytes(experts.w2_weight[5]), _bytes(saved[p + "down_proj.weight"]))
    assert torch.equal(experts.w2_weight_scale[5], saved[p + "down_proj.weight_scale_inv"])
    assert torch.equal(model.model.layers[0].mlp.gate.weight, saved["model.layers.0.mlp.gate.weight"])  # router


def test_block_fp8_attention_and_dense_mlps_get_per_channel_scales_of_the_dequantized_weight(block_checkpoint):
    model = _load(block_checkpoint)
    saved = load_file(str(block_checkpoint / "model.safetensors"))
    o_proj = model.model.layers[1].self_attn.o_proj
    stem = "model.layers.1.self_attn.o_proj."
    q, scale = quantize_rows(dequantize_blocks(saved[stem + "weight"], saved[stem + "weight_scale_inv"], torch.float32))
    assert o_proj.weight.dtype == FP8 and o_proj.weight_scale.shape == (64,)
    assert torch.equal(_bytes(o_proj.weight), _bytes(q)) and torch.equal(o_proj.weight_scale, scale)
    dense = model.model.layers[2].mlp.down_proj  # layer 2 is in mlp_only_layers
    assert dense.weight.dtype == FP8 and dense.weight_scale.shape == (64,)


def test_block_fp8_checkpoint_stays_close_to_the_float_model(tiny_models, block_checkpoint):
    """Measured worst layer cosine 0.9666 and mean KL 0.048 nats (the tiny tensors are one block each, so their
    scales are per tensor, and attention's are rounded twice; the float checkpoint quantized at load: 0.9773,
    0.033); thresholds at about twice the error."""
    ref = prefill(build_runner(tiny_models["qwen3moe"], PROMPTS, device="cpu"), PROMPTS)
    got = prefill(build_runner(str(block_checkpoint), PROMPTS, device="cpu"), PROMPTS)
    result = compare(ref, got)
    assert min(result.layer_cosine) >= 0.93 and result.logit_kl_mean <= 0.1, result.to_dict()


def test_quantizing_a_bf16_moe_checkpoint_at_load_quantizes_its_experts_by_blocks(tiny_models):
    model = _load(Path(tiny_models["qwen3moe"]), quantization="fp8")
    saved = load_file(str(f"{tiny_models['qwen3moe']}/model.safetensors"))
    experts = model.model.layers[3].mlp.experts
    q, scale = quantize_blocks(saved["model.layers.3.mlp.experts.2.up_proj.weight"])
    assert torch.equal(_bytes(experts.w13_weight[2, 32:]), _bytes(q))
    assert torch.equal(experts.w13_weight_scale[2, 1:], scale)
