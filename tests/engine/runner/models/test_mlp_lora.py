"""A dense MLP with adapter slots on gate/up and down: where the LoRA kernels run, the gate/up adapters' sums join
the SiLU-and-mul's pass (one kernel, y read once), down's are added by shrink and expand, and the output is the torch
reference's. GPU when there is one, else the kernels run in Triton's CPU interpreter, routed as on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import lora_ops  # noqa: E402
from railyard.engine.runner.layers.lora import LoRABatch, LoRAWeights  # noqa: E402
from railyard.engine.runner.layers.parallel import SINGLE  # noqa: E402
from railyard.engine.runner.models.decoder import MLP  # noqa: E402
from railyard.model.spec import ModelSpec  # noqa: E402
from railyard.shapes import shape_config  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPEC = ModelSpec.from_hf_config(dict(shape_config("qwen2-7b"), hidden_size=48, intermediate_size=80,
                                     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=100))


def _mlp_with_adapters(slots: list[int], num_slots: int = 3, rank: int = 16):
    torch.manual_seed(0)
    mlp = MLP(SPEC, SINGLE).to(DEVICE)
    for linear in (mlp.gate_up_proj, mlp.down_proj):
        linear.weight.data.normal_(0, linear.weight.shape[1] ** -0.5)
    batch = LoRABatch(num_slots, max_tokens=len(slots), device=DEVICE)
    inter, hidden = SPEC.intermediate_size, SPEC.hidden_size
    mlp.gate_up_proj.lora = LoRAWeights(batch, rank, hidden, [inter, inter], torch.float32, DEVICE)
    mlp.down_proj.lora = LoRAWeights(batch, rank, inter, [hidden], torch.float32, DEVICE)
    for lora in (mlp.gate_up_proj.lora, mlp.down_proj.lora):
        lora.a.normal_(0, lora.a.shape[-1] ** -0.5)
        lora.b.normal_(0, 0.5)
    batch.allocate()
    batch.stage(np.array(slots, dtype=np.int32))
    batch.prepare(len(slots))
    return mlp, torch.randn(len(slots), hidden).to(DEVICE)


@pytest.mark.parametrize("slots", [[0, -1, 2, 2, 1, -1, 0], [-1, -1, -1]], ids=["adapters-and-base", "base-only"])
def test_the_fused_gate_up_adapters_give_the_unfused_mlp(monkeypatch, slots):
    mlp, x = _mlp_with_adapters(slots)
    monkeypatch.setattr(LoRAWeights, "kernels", staticmethod(lambda x: None))
    unfused = mlp(x)  # the torch reference adds each adapter to gate/up, then the activation
    calls = []
    real_silu_and_mul = LoRAWeights.silu_and_mul

    def spy(self, *args):
        calls.append(self)
        return real_silu_and_mul(self, *args)

    monkeypatch.setattr(LoRAWeights, "kernels", staticmethod(lambda x: lora_ops()))  # as on CUDA tensors
    monkeypatch.setattr(LoRAWeights, "silu_and_mul", spy)
    fused = mlp(x)
    assert calls == [mlp.gate_up_proj.lora]
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-4)
    base = torch.tensor([s < 0 for s in slots], device=DEVICE)
    plain = _without_adapters(mlp)(x)
    torch.testing.assert_close(fused[base], plain[base], rtol=1e-4, atol=1e-4)  # base rows: the base model's
    if (~base).any():
        assert not torch.allclose(fused[~base], plain[~base], atol=1e-2)  # adapter rows: not the base model's


def _without_adapters(mlp: MLP) -> MLP:
    """The same MLP with its slots detached (the base model alone)."""
    plain = MLP(SPEC, SINGLE).to(DEVICE)
    plain.load_state_dict(mlp.state_dict())
    return plain
