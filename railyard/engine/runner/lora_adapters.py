"""This rank's LoRA adapters: the device slots every decoder linear layer holds, and a host-memory tier.

The scheduler decides which adapter each slot holds (railyard.engine.lora.slots); a step's plan carries the loads
that decision needs, and every tensor-parallel rank makes them here before its forward pass: from the host tier
(up to max_cpu_loras adapters, least recently used dropped first), else from the adapter's directory. On the host an
adapter is already this rank's shard, laid out as a slot is (the fused projections' parts in place, the rank padded,
the scaling folded into B), so loading a slot is two copies per layer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from railyard.engine.config import EngineConfig
from railyard.engine.lora.peft import TENSOR_KEY, AdapterSpec, inspect_adapter
from railyard.engine.lora.request import LoRARequest
from railyard.engine.runner.layers.lora import LoRABatch, LoRAWeights
from railyard.model.memory import lora_rank_tile
from railyard.model.spec import ModelSpec

# Each adapted linear layer of a decoder layer: its attribute path and its parts as (HF module, loader shard id).
TARGETS = {
    "self_attn.qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
    "self_attn.o_proj": [("o_proj", None)],
    "mlp.gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    "mlp.down_proj": [("down_proj", None)],
}
_ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


@dataclass
class _Target:
    """One adapted linear layer of one decoder layer."""

    layer: int
    path: str
    linear: torch.nn.Module
    weights: LoRAWeights


class LoRAAdapters:
    """Attaches LoRA slots to the model's linear layers and fills them as steps ask."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, config: EngineConfig, dtype: torch.dtype,
                 device: torch.device, max_tokens: int) -> None:
        self.spec, self.dtype, self.device = spec, dtype, device
        self.max_lora_rank = config.max_lora_rank
        self.rank = lora_rank_tile(config.max_lora_rank)  # zero rows change nothing
        self.max_cpu_loras = config.max_cpu_loras or config.max_loras
        self.batch = LoRABatch(config.max_loras, max_tokens, device)
        self.targets: list[_Target] = []
        for i, layer in enumerate(model.model.layers):
            for path, parts in TARGETS.items():
                if path.startswith("mlp.") and spec.is_moe_layer(i):
                    continue  # a mixture of experts: its projections are the experts' (inspect_adapter refuses them)
                linear = layer.get_submodule(path)
                weights = LoRAWeights(self.batch, self.rank, linear.weight.shape[1], _part_sizes(linear, len(parts)),
                                      dtype, device)
                linear.lora = weights
                self.targets.append(_Target(i, path, linear, weights))
            layer.adapters_attached()
        self.batch.allocate()
        model.model.lora_batch = self.batch
        self.host: OrderedDict[int, list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self.slots: list[int | None] = [None] * config.max_loras  # the adapter id each slot holds

    @property
    def device_bytes(self) -> int:
        """The slots' device memory (model/memory.py's lora_slot_bytes predicts it for the planner)."""
        return sum(t.weights.a.nbytes + t.weights.b.nbytes for t in self.targets)

    def stage(self, slots_per_seq: list[int], query_start_loc: list[int]) -> None:
        """The next forward pass's slot per token, from each scheduled sequence's slot (-1: the base model)."""
        self.batch.stage(np.repeat(np.asarray(slots_per_seq, dtype=np.int32), np.diff(query_start_loc)))

    def load(self, slot: int, request: LoRARequest) -> None:
        """Put an adapter's weights into a slot (queued on the device after the work already queued)."""
        tensors = self._host(request)
        for target, (a, b) in zip(self.targets, tensors):
            target.weights.a[slot].copy_(a, non_blocking=True)
            target.weights.b[slot].copy_(b, non_blocking=True)
        self.slots[slot] = request.lora_int_id

    def prefetch(self, request: LoRARequest) -> None:
        """Read an adapter into the host tier now (when it is loaded), not at its first request."""
        self._host(request)

    def forget(self, lora_int_id: int) -> None:
        """Drop an unloaded adapter from the host tier (its slot is reused when the scheduler says so)."""
        self.host.pop(lora_int_id, None)

    # -- the host tier ------------------------------------------------------------------------------
    def _host(self, request: LoRARequest) -> list[tuple[torch.Tensor, torch.Tensor]]:
        held = self.host.get(request.lora_int_id)
        if held is not None:
            self.host.move_to_end(request.lora_int_id)
            return held
        held = self._read(inspect_adapter(request, self.spec, self.max_lora_rank))
        self.host[request.lora_int_id] = held
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)
        return held

    def _read(self, adapter: AdapterSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's (A, B) of every target, laid out as one slot holds them."""
        from safetensors.torch import load_file

        weights: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, tensor in load_file(str(adapter.weights_file)).items():
            m = TENSOR_KEY.search(key)
            weights.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = tensor
        pin = self.device.type == "cuda"
        out = []
        for target in self.targets:
            w = target.weights
            a = torch.zeros(w.a.shape[1:], dtype=self.dtype, pin_memory=pin)
            b = torch.zeros(w.b.shape[1:], dtype=self.dtype, pin_memory=pin)
            for i, (module, shard) in enumerate(TARGETS[target.path]):
                ab = weights.get((target.layer, module))
                if ab is None:
                    continue
                r = adapter.ranks[(target.layer, module)]
                lora_a = _pad(ab["A"].float(), 0, self.rank).to(self.dtype)
                lora_b = _pad(ab["B"].float() * adapter.scaling(r), 1, self.rank).to(self.dtype)
                if target.path in _ROW_PARALLEL:  # A split like the layer's input columns, B whole
                    target.linear._load(a, lora_a, shard)
                    b.copy_(lora_b)
                else:  # A whole (part i's rank block), B split like the layer's output rows
                    a[i * self.rank:(i + 1) * self.rank].copy_(lora_a)
                    target.linear._load(b, lora_b, shard)
            out.append((a, b))
        return out


def _part_sizes(linear: torch.nn.Module, parts: int) -> list[int]:
    """A fused layer's parts' output rows on this rank (q, k, v or gate, up), or its one part."""
    if parts == 3:  # QKV: the rank's q heads, then as many rows of k as of v
        q, kv = linear.num_heads * linear.head_dim, linear.num_kv_heads * linear.head_dim
        return [q, kv, kv]
    return [linear.weight.shape[0] // parts] * parts


def _pad(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """t zero-padded along dim to size (a rank below the slots' rank tile)."""
    if t.shape[dim] == size:
        return t
    shape = list(t.shape)
    shape[dim] = size - shape[dim]
    return torch.cat([t, t.new_zeros(shape)], dim=dim)
