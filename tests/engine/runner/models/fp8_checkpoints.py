"""Write FP8 checkpoints, in the two layouts vLLM loads, from a float tiny checkpoint (test fixtures).

- "compressed-tensors": llm-compressor's FP8_DYNAMIC scheme: float8_e4m3fn `weight`, float32
  `weight_scale` [out, 1] (one per output channel), activations FP8 per token, dynamic.
- "fp8": vLLM's Fp8Config (AutoFP8): one float32 `weight_scale` per weight tensor, static activation
  scales (`input_scale`), optional per-layer KV-cache scales (`self_attn.k_scale` / `v_scale`).
- "fp8-block": Fp8Config with `weight_block_size: [128, 128]` (Qwen3-30B-A3B-FP8): every linear weight, experts'
  too, with one float32 `weight_scale_inv` per 128 x 128 block; the router and the LM head unquantized.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from railyard.engine.runner.layers.fp8 import FP8_MAX, quantize_rows, to_fp8
from railyard.engine.runner.layers.fp8_block import quantize_blocks

_LINEAR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")

COMPRESSED_TENSORS_CONFIG = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                              "dynamic": True},
    }},
    "ignore": ["lm_head"], "kv_cache_scheme": None,
}
FP8_METHOD_CONFIG = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
FP8_BLOCK_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                    "weight_block_size": [128, 128]}


def write_fp8_checkpoint(src: str | Path, dst: str | Path, fmt: str,
                         kv_scales: dict[int, tuple[float, float]] | None = None,
                         quantization_config: dict | None = None) -> Path:
    """dst: src with its decoder linear weights in FP8 (format `fmt`) and config.json saying so."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    out = {}
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        if not _LINEAR.search(name):
            out[name] = tensor
            continue
        stem = name.removesuffix("weight")
        if fmt == "compressed-tensors":
            q, scale = quantize_rows(tensor)
            out[name], out[stem + "weight_scale"] = q, scale[:, None].contiguous()
        elif fmt == "fp8-block":
            out[name], out[stem + "weight_scale_inv"] = quantize_blocks(tensor)
        elif fmt == "fp8":
            scale = tensor.abs().max().float() / FP8_MAX
            out[name], out[stem + "weight_scale"] = to_fp8(tensor.float() / scale), scale.reshape(())
            out[stem + "input_scale"] = torch.tensor(0.05)  # static activation scale: not used by railyard
        else:
            raise ValueError(f"unknown FP8 checkpoint format {fmt!r}")
    for layer, (k, v) in (kv_scales or {}).items():
        out[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k)
        out[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = quantization_config or {"compressed-tensors": COMPRESSED_TENSORS_CONFIG,
                                                         "fp8": FP8_METHOD_CONFIG, "fp8-block": FP8_BLOCK_CONFIG}[fmt]
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst
