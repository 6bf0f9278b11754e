"""Reading a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) and checking it against
the base model before anything of it reaches a device.

Torch-free: the shapes come from the safetensors header, so a bad adapter (wrong shapes for this model, a rank over
max_lora_rank, missing files, pickled weights, modules the model lacks, PEFT features railyard does not compute) is
refused with an InvalidRequestError before any running request could be disturbed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from railyard.engine.config import MAX_LORA_RANK
from railyard.engine.lora.request import LoRARequest
from railyard.errors import InvalidRequestError
from railyard.model.spec import ModelSpec

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLED_WEIGHTS = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
# The projections an adapter may target: the decoder's seven linear layers, as HF names them.
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")  # a dense MLP's (not a mixture of experts' layers)
# A LoRA weight as PEFT names it: ...layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
TENSOR_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# PEFT options that change what an adapter computes beyond x A^T B^T * scaling: refused rather than ignored.
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)", "lora_bias": "LoRA biases (lora_bias)", "fan_in_fan_out": "fan_in_fan_out",
    "modules_to_save": "modules_to_save (fully trained extra modules)", "alpha_pattern": "alpha_pattern",
    "trainable_token_indices": "trainable_token_indices", "layer_replication": "layer_replication",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "target_parameters": "target_parameters",
}


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter checked against one base model: each adapted (layer, module) and its rank, and the scaling."""

    request: LoRARequest
    weights_file: Path
    ranks: dict[tuple[int, str], int]  # (layer index, HF module name) -> rank
    lora_alpha: float
    use_rslora: bool

    @property
    def max_rank(self) -> int:
        return max(self.ranks.values())

    def scaling(self, rank: int) -> float:
        """What PEFT multiplies x A^T B^T by: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA."""
        return self.lora_alpha / (math.sqrt(rank) if self.use_rslora else rank)

    @property
    def modules(self) -> list[str]:
        return sorted({m for _, m in self.ranks}, key=MODULES.index)


def module_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """Each adaptable module's (in_features, out_features) in the whole (unsharded) model."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    h, i = spec.hidden_size, spec.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def inspect_adapter(request: LoRARequest, spec: ModelSpec, max_rank: int) -> AdapterSpec:
    """Read and check a PEFT adapter for this model; InvalidRequestError says what is wrong and how to fix it."""
    name = request.lora_name
    root = Path(request.lora_path).expanduser()
    if not root.is_dir():
        raise InvalidRequestError(f"LoRA adapter {name!r}: {request.lora_path!r} is not a directory")
    config = _read_config(root, name)
    weights = root / WEIGHTS_FILE
    if not weights.is_file():
        pickled = [p for p in PICKLED_WEIGHTS if (root / p).is_file()]
        if pickled:
            raise InvalidRequestError(f"LoRA adapter {name!r}: {pickled[0]} is a pickle, which railyard never loads "
                                      f"(it can run code); save the adapter as {WEIGHTS_FILE} "
                                      "(PEFT's save_pretrained(..., safe_serialization=True))")
        raise InvalidRequestError(f"LoRA adapter {name!r}: {root} has no {WEIGHTS_FILE}")
    shapes = _tensor_shapes(weights, name)
    ranks = _check_tensors(shapes, spec, max_rank, name)
    return AdapterSpec(request, weights, ranks, float(config.get("lora_alpha", 8)), bool(config.get("use_rslora")))


def _read_config(root: Path, name: str) -> dict:
    path = root / CONFIG_FILE
    if not path.is_file():
        raise InvalidRequestError(f"LoRA adapter {name!r}: {root} has no {CONFIG_FILE} (not a PEFT adapter)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"LoRA adapter {name!r}: {path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidRequestError(f"LoRA adapter {name!r}: {path} is not a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise InvalidRequestError(f"LoRA adapter {name!r}: peft_type {peft_type} is not LoRA")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise InvalidRequestError(f"LoRA adapter {name!r} uses {what}, which railyard does not support")
    if config.get("bias", "none") != "none":
        raise InvalidRequestError(f"LoRA adapter {name!r} trains biases (bias: {config['bias']!r}), which railyard "
                                  "does not support")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
        raise InvalidRequestError(f"LoRA adapter {name!r}: lora_alpha must be a positive number, got {alpha!r}")
    return config


def _tensor_shapes(path: Path, name: str) -> dict[str, list[int]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # a truncated or foreign file: safetensors says what is wrong with it
        raise InvalidRequestError(f"LoRA adapter {name!r}: {path} is not a readable safetensors file: {exc}") \
            from None


def _check_tensors(shapes: dict[str, list[int]], spec: ModelSpec, max_rank: int, name: str) \
        -> dict[tuple[int, str], int]:
    expected = module_shapes(spec)
    pairs: dict[tuple[int, str], dict[str, list[int]]] = {}
    for key, shape in shapes.items():
        m = TENSOR_KEY.search(key)
        if m is None:
            raise InvalidRequestError(f"LoRA adapter {name!r}: tensor {key!r} is not the LoRA A or B weight of a "
                                      f"decoder projection; railyard adapts {', '.join(MODULES)} only")
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if module not in expected:
            raise InvalidRequestError(f"LoRA adapter {name!r} targets {module!r}, which this model's layers do not "
                                      f"have (they have {', '.join(MODULES)})")
        if layer >= spec.num_layers:
            raise InvalidRequestError(f"LoRA adapter {name!r} adapts layer {layer}, but the model has "
                                      f"{spec.num_layers} layers")
        if module in MLP_MODULES and spec.is_moe_layer(layer):
            raise InvalidRequestError(f"LoRA adapter {name!r} adapts {module} of layer {layer}, whose MLP is a mixture "
                                      "of experts: railyard adapts the attention projections of such layers only")
        pairs.setdefault((layer, module), {})[which] = shape
    if not pairs:
        raise InvalidRequestError(f"LoRA adapter {name!r} holds no LoRA weights")
    ranks = {}
    for (layer, module), ab in sorted(pairs.items()):
        where = f"LoRA adapter {name!r}, layer {layer} {module}"
        if set(ab) != {"A", "B"}:
            raise InvalidRequestError(f"{where}: lora_{'B' if 'A' in ab else 'A'} is missing")
        a, b = ab["A"], ab["B"]
        fan_in, fan_out = expected[module]
        if len(a) != 2 or len(b) != 2 or a[1] != fan_in or b[0] != fan_out or a[0] != b[1]:
            raise InvalidRequestError(f"{where}: lora_A {a} and lora_B {b} do not fit this model (want "
                                      f"[r, {fan_in}] and [{fan_out}, r]); was the adapter trained on another model?")
        if not 1 <= a[0] <= max_rank:
            fix = f"start the engine with --max-lora-rank {a[0]} or more" if a[0] <= MAX_LORA_RANK \
                else f"railyard serves ranks up to {MAX_LORA_RANK}"
            raise InvalidRequestError(f"{where}: rank {a[0]} is over max_lora_rank {max_rank}; {fix}")
        ranks[(layer, module)] = a[0]
    return ranks
