"""A LoRA adapter on FP8 weights, against the same adapter on the unquantized (bf16) model: the adapter's sums run
on the layer's unquantized input and add to the FP8 GEMM's output, so the pair drifts no further apart than FP8
weights alone do (tests/bench/test_fp8_accuracy.py's thresholds), while leaving the adapter out moves the logits
much further: the comparison sees the adapter.

Measured (CPU, torch 2.13, bf16): with the adapter, worst layer cosine 0.987-0.993 and mean KL 0.010-0.018 nats;
left out, cosine 0.07-0.15 and KL 1.21-1.31."""

from __future__ import annotations

import random

import pytest

from railyard.bench.accuracy import compare_prefill
from railyard.engine.lora.request import LoRARequest
from tests.bench.test_fp8_accuracy import THRESHOLDS
from tests.engine.lora.adapters import write_adapter

_rng = random.Random(7)
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (40, 97, 128)]
ARCHS = ("qwen2", "qwen3", "llama")
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CANDIDATES = {
    "fp8 weights + adapter": dict(quantization="fp8", enable_lora=True),
    "fp8 weights, adapter left out": dict(quantization="fp8"),
}


@pytest.fixture(scope="module")
def against_bf16_with_adapter(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8-lora")
    out = {}
    for i, arch in enumerate(ARCHS):
        path = write_adapter(tiny_models[arch], root / arch, seed=i, r=8, lora_alpha=16, target_modules=ALL_PROJECTIONS)
        out[arch] = compare_prefill(tiny_models[arch], PROMPTS, dict(enable_lora=True), CANDIDATES,
                                    lora=LoRARequest("every-projection", 1, path), device="cpu", dtype="bfloat16")
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_an_adapter_on_fp8_weights_stays_as_close_as_fp8_weights_alone(against_bf16_with_adapter, arch):
    result = against_bf16_with_adapter[arch]["fp8 weights + adapter"]
    cosine, kl = THRESHOLDS["fp8 weights"]
    assert result.num_tokens == sum(map(len, PROMPTS))
    assert min(result.layer_cosine) >= cosine and result.logit_kl_mean <= kl, result.to_dict()


@pytest.mark.parametrize("arch", ARCHS)
def test_leaving_the_adapter_out_drifts_far_more(against_bf16_with_adapter, arch):
    with_adapter = against_bf16_with_adapter[arch]["fp8 weights + adapter"]
    without = against_bf16_with_adapter[arch]["fp8 weights, adapter left out"]
    assert without.logit_kl_mean > 10 * THRESHOLDS["fp8 weights"][1], (with_adapter.to_dict(), without.to_dict())
