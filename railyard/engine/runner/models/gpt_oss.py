"""gpt-oss's MLP: a router with a bias picks each token's top-k experts (softmax over the k chosen logits), whose
MLPs carry biases and a clamped SwiGLU; on FusedMoE (layers/moe.py), with MXFP4 experts as the checkpoints ship them.

HF names: `mlp.router.{weight,bias}`, and the experts stacked in one tensor each: `mlp.experts.gate_up_proj`
[E, H, 2I] with gate and up interleaved along 2I (even: gate, odd: up) and `down_proj` [E, I, H] (bf16
checkpoints, x @ W layout), their `_bias`es, or MXFP4 `gate_up_proj_blocks` / `_scales` [E, 2I, ...] and
`down_proj_blocks` / `_scales` [E, H, ...] (out x in, as the real checkpoints). They load expert by expert through
FusedMoE's loader, gate and up de-interleaved into its gate-then-up halves (which tensor parallelism splits).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from railyard.engine.runner.layers.activation import ClampedSwiGLU
from railyard.engine.runner.layers.moe import FusedMoE, on_device, route_topk_softmax
from railyard.engine.runner.layers.parallel import ParallelState
from railyard.model.spec import ModelSpec

# A checkpoint's stacked expert tensor -> (our parameter's suffix, how it is laid out).
EXPERT_TENSOR = re.compile(r"\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")
_TARGETS = {("gate_up_proj", ""): "w13_weight", ("gate_up_proj", "_bias"): "w13_bias",
            ("gate_up_proj", "_blocks"): "w13_weight", ("gate_up_proj", "_scales"): "w13_weight_scale",
            ("down_proj", ""): "w2_weight", ("down_proj", "_bias"): "w2_bias",
            ("down_proj", "_blocks"): "w2_weight", ("down_proj", "_scales"): "w2_weight_scale"}


def gpt_oss_expert_target(name: str) -> tuple[str, tuple[str, str]] | None:
    """(our stacked parameter's name, (projection, kind)) for a gpt-oss checkpoint's expert tensor; None for others."""
    match = EXPERT_TENSOR.search(name)
    if match is None:
        return None
    proj, kind = match.group(1), match.group(2) or ""
    return f"{name[:match.start()]}.experts.{_TARGETS[proj, kind]}", (proj, kind)


class GptOssMLP(nn.Module):
    """Router (replicated, with a bias) and experts; one all-reduce of the weighted sum across ranks."""

    def __init__(self, spec: ModelSpec, ps: ParallelState) -> None:
        super().__init__()
        self.top_k = spec.num_experts_per_tok
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=True)
        self.router.requires_grad_(False)
        alpha, limit = spec.swiglu
        self.experts = FusedMoE(spec.num_experts, spec.hidden_size, spec.moe_intermediate_size, ps, bias=True,
                                activation=ClampedSwiGLU(alpha, limit),
                                quant=spec.expert_quantization or spec.quantization)
        for param in self.experts.parameters():
            param.weight_loader = self._load_stacked

    def forward(self, x: torch.Tensor, defer_scales: bool = False) -> torch.Tensor:
        """x [T, H] -> [T, H] (defer_scales: the dense MLP's option; experts always apply their scales)."""
        logits = F.linear(x, self.router.weight, self.router.bias)
        weights, ids = on_device(route_topk_softmax, logits)(logits, self.top_k)
        return self.experts(x, weights, ids)

    def _load_stacked(self, param: nn.Parameter, loaded: torch.Tensor, shard: tuple[str, str]) -> None:
        """A stacked checkpoint tensor of all experts, handed to FusedMoE's loader one expert at a time."""
        proj, kind = shard
        load = self.experts.expert_loader
        for e in range(loaded.shape[0]):
            t = loaded[e]
            if kind == "":  # bf16 layout [in, out]
                t = t.t()
            elif kind in ("_blocks", "_scales"):  # [out, groups(, 16 bytes)]: a row of packed bytes or exponents
                t = t.reshape(t.shape[0], -1)
            if proj == "down_proj":
                load(param, t, (e, "down"))
            else:  # gate and up interleaved along the output rows
                load(param, t[0::2], (e, "gate"))
                load(param, t[1::2], (e, "up"))
