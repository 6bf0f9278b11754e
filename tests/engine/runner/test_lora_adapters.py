"""The runner's LoRA adapters: device slots on every decoder projection, as large as the planner predicts; a
host-memory tier of max_cpu_loras adapters, least recently used dropped first; a slot loaded with another adapter
holds that adapter alone."""

from __future__ import annotations

import pytest
import torch

from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.engine.lora.request import LoRARequest
from railyard.model.memory import lora_slot_bytes
from tests.engine.lora.adapters import write_adapter


@pytest.fixture(scope="module")
def loras(tiny_model, tmp_path_factory) -> list[LoRARequest]:
    root = tmp_path_factory.mktemp("runner-adapters")
    targets = [["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], ["v_proj"], ["up_proj"]]
    return [LoRARequest(f"a{i}", i + 1, write_adapter(tiny_model, root / f"a{i}", seed=i, r=8, lora_alpha=8,
                                                      target_modules=t)) for i, t in enumerate(targets)]


def _adapters(model: str, **config):
    engine = Engine(EngineConfig(model=model, enable_lora=True, max_model_len=128, num_gpu_blocks=32, **config))
    return engine, engine.executor.runner.lora


def test_the_device_slots_take_what_the_planner_predicts(tiny_model):
    engine, adapters = _adapters(tiny_model, max_loras=3, max_lora_rank=24)
    assert adapters.device_bytes == lora_slot_bytes(engine.executor.runner.spec, 3, 24)


def test_the_host_tier_keeps_max_cpu_loras_adapters_dropping_the_least_recently_used(tiny_model, loras):
    _, adapters = _adapters(tiny_model, max_loras=1, max_cpu_loras=2)
    a0, a1, a2 = loras
    adapters.load(0, a0)
    adapters.load(0, a1)
    adapters.load(0, a0)  # a0 used again: a1 is the least recently used
    adapters.load(0, a2)
    assert list(adapters.host) == [a0.lora_int_id, a2.lora_int_id]
    adapters.load(0, a1)  # back from its directory
    assert list(adapters.host) == [a2.lora_int_id, a1.lora_int_id]


def test_a_slot_loaded_with_another_adapter_holds_that_adapter_alone(tiny_model, loras):
    _, adapters = _adapters(tiny_model, max_loras=2)
    everything, only_v, _ = loras
    adapters.load(1, everything)
    adapters.load(1, only_v)
    for target in adapters.targets:
        a, b = target.weights.a[1], target.weights.b[1]
        if target.path == "self_attn.qkv_proj":
            q, kv = target.weights.part_sizes[0], target.weights.part_sizes[1]
            assert torch.count_nonzero(b[:q + kv]) == 0 and torch.count_nonzero(b[q + kv:]) > 0  # v's rows only
        else:
            assert torch.count_nonzero(a) == 0 and torch.count_nonzero(b) == 0
    assert adapters.slots == [None, only_v.lora_int_id]


def _fused_quantization(engine) -> list[tuple[bool, ...]]:
    """Per decoder layer: whether its norms quantize for qkv and gate_up, and whether each projection may be handed a
    quantized activation."""
    out = []
    for layer in engine.executor.runner.model.model.layers:
        projections = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        out.append((layer.input_layernorm.quantize_output, layer.post_attention_layernorm.quantize_output,
                    *(p.takes_quantized_input for p in projections)))
    return out


def test_fp8_projections_with_adapter_slots_read_their_input_unquantized(tiny_model):
    """An adapter's shrink reads the layer's input as it is: the norms stop handing qkv and gate_up a quantized
    activation, the MLP stops quantizing for down, and o and down give their norm a plain output."""
    plain = Engine(EngineConfig(model=tiny_model, quantization="fp8", max_model_len=128, num_gpu_blocks=32))
    assert all(all(flags) for flags in _fused_quantization(plain))  # the control: FP8 alone fuses everywhere
    engine, adapters = _adapters(tiny_model, quantization="fp8", max_loras=2, max_lora_rank=16)
    assert not any(any(flags) for flags in _fused_quantization(engine))
    assert adapters.device_bytes == lora_slot_bytes(engine.executor.runner.spec, 2, 16)  # slots in the model dtype
