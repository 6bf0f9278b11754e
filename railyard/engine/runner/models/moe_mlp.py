"""The MLP of a mixture-of-experts decoder layer (Qwen3-MoE's sparse block): router, then experts.

HF names: `mlp.gate.weight` (the router, [E, H]: replicated on every rank and kept in the model dtype, as vLLM
does, since routing decides discrete choices) and `mlp.experts.<e>.{gate,up,down}_proj.weight` (per expert;
stacked as they load, layers/moe.py).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.runner.layers.moe import FusedMoE, on_device, route_softmax_topk
from railyard.engine.runner.layers.parallel import ParallelState
from railyard.model.spec import ModelSpec

# A checkpoint's per-expert tensor: experts.<e>.<projection>.<weight | bias | scale> -> our stacked parameter.
EXPERT_TENSOR = re.compile(r"\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias|weight_scale_inv|weight_scale)$")
_STACKED = {"gate": "w13", "up": "w13", "down": "w2"}
_SUFFIX = {"weight": "weight", "bias": "bias", "weight_scale_inv": "weight_scale", "weight_scale": "weight_scale"}


def expert_target(name: str) -> tuple[str, tuple[int, str]] | None:
    """(our parameter's name, its loader's shard) for a checkpoint's per-expert tensor name; None for others."""
    match = EXPERT_TENSOR.search(name)
    if match is None:
        return None
    expert, proj, kind = match.groups()
    return f"{name[:match.start()]}.experts.{_STACKED[proj]}_{_SUFFIX[kind]}", (int(expert), proj)


class MoEMLP(nn.Module):
    """Softmax top-k routing over spec.num_experts experts (renormalised when spec.norm_topk_prob), SiLU-and-mul
    experts, one all-reduce of the weighted sum across tensor-parallel ranks."""

    def __init__(self, spec: ModelSpec, ps: ParallelState) -> None:
        super().__init__()
        self.top_k, self.renormalize = spec.num_experts_per_tok, spec.norm_topk_prob
        self.gate = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.gate.weight.requires_grad_(False)
        self.experts = FusedMoE(spec.num_experts, spec.hidden_size, spec.moe_intermediate_size, ps,
                                quant=spec.quantization)

    def forward(self, x: torch.Tensor, defer_scales: bool = False) -> torch.Tensor:
        """x [T, H] -> [T, H] (defer_scales: the dense MLP's option; experts always apply their scales)."""
        logits = F.linear(x, self.gate.weight)
        weights, ids = on_device(route_softmax_topk, logits)(logits, self.top_k, self.renormalize)
        return self.experts(x, weights, ids)
