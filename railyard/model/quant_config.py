"""Which pre-quantized checkpoint formats load: the `quantization_config` of an HF config.json.

Two FP8 formats that vLLM loads, both as float8_e4m3fn weights with float32 `weight_scale` tensors:
- vLLM's Fp8Config (`quant_method: "fp8"`, AutoFP8 / llm-compressor's older export): one scale per
  weight tensor (q, k and v each their own), `activation_scheme` dynamic or static;
- compressed-tensors (`quant_method: "compressed-tensors"`, format float-quantized): FP8 weights with
  `strategy` channel (scale [out, 1]) or tensor, activations FP8 per token (dynamic) or per tensor (static).
Both may instead carry block-wise scales, one per 128 x 128 block of a weight (`weight_block_size: [128, 128]`
with `weight_scale_inv` tensors, as Qwen3-30B-A3B-FP8 and DeepSeek-V3 ship; compressed-tensors `strategy: block`
with `block_structure: [128, 128]`): experts keep them as shipped (layers/fp8_block.py), other layers' weights are
converted to per-channel scales as they load. Other block sizes are refused.
Static activation scales (`input_scale`) are not used: activations are always quantized per token on the
fly, which is at least as accurate. Every non-FP8 scheme is refused with a clear error. Torch-free:
ModelSpec.from_hf_config calls it, so the planner refuses what the engine refuses.
"""

from __future__ import annotations

import logging

from railyard.errors import ModelLoadError

BLOCK = [128, 128]  # the one FP8 block shape loaded: model/spec.py's EXPERT_BLOCK

log = logging.getLogger("railyard.model")

_FORMATS = ("float-quantized", "naive-quantized")


def checkpoint_quantization(cfg: dict) -> str | None:
    """"fp8" for an FP8 checkpoint in a supported format, None for an unquantized one (or one whose experts only
    are quantized: checkpoint_expert_quantization)."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    if checkpoint_expert_quantization(cfg):
        return None
    if not isinstance(qc, dict):
        raise ModelLoadError("config.json: quantization_config must be an object")
    method = qc.get("quant_method")
    if not isinstance(method, str):
        raise ModelLoadError(f"config.json: quantization_config must name its quant_method, got {qc!r}")
    if method == "fp8":
        _check_fp8_method(qc)
    elif method == "compressed-tensors":
        _check_compressed_tensors(qc)
    else:
        raise ModelLoadError(f"quantization method {method!r} is not supported; railyard loads FP8 checkpoints "
                             "(quant_method 'fp8', or 'compressed-tensors' with FP8 channel or tensor scales)")
    return "fp8"


def checkpoint_expert_quantization(cfg: dict) -> str | None:
    """"mxfp4" for gpt-oss's checkpoints (quant_method mxfp4: MXFP4 experts, every other weight unquantized), which
    only gpt-oss's experts load; None otherwise."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "mxfp4":
        return None
    if "GptOssForCausalLM" not in (cfg.get("architectures") or []):
        raise ModelLoadError("quant_method mxfp4 is supported for gpt-oss (GptOssForCausalLM) experts only")
    return "mxfp4"


def checkpoint_block_scales(cfg: dict) -> bool:
    """Whether an FP8 checkpoint's weights carry block-wise scales (checked by checkpoint_quantization)."""
    qc = cfg.get("quantization_config") or {}
    if qc.get("quant_method") == "fp8":
        return bool(qc.get("weight_block_size"))
    if qc.get("quant_method") == "compressed-tensors":
        return any((g.get("weights") or {}).get("strategy") == "block"
                   for g in (qc.get("config_groups") or {}).values())
    return False


def _check_fp8_method(qc: dict) -> None:
    block = qc.get("weight_block_size")
    if block and list(block) != BLOCK:
        raise ModelLoadError(f"block-wise FP8 scales of weight_block_size {block} are not supported; railyard loads "
                             f"per-tensor, per-channel or {BLOCK[0]}x{BLOCK[1]} block scales")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ModelLoadError(f"unknown FP8 activation_scheme {scheme!r} (expected dynamic or static)")
    if scheme == "static":
        log.info("FP8 checkpoint with static activation scales: activations are quantized per token instead")


def _check_compressed_tensors(qc: dict) -> None:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise ModelLoadError("compressed-tensors quantization_config has no config_groups")
    for name, group in groups.items():
        group_fmt = group.get("format") or fmt
        if group_fmt not in _FORMATS:
            raise ModelLoadError(f"compressed-tensors group {name!r}: format {group_fmt!r} is not supported "
                                 f"(supported: {', '.join(_FORMATS)} FP8)")
        w = group.get("weights") or {}
        block = w.get("strategy") == "block" and list(w.get("block_structure") or []) == BLOCK
        if not (w.get("num_bits") == 8 and w.get("type") == "float"
                and (w.get("strategy") in ("channel", "tensor") or block) and w.get("symmetric", True)):
            raise ModelLoadError(
                f"compressed-tensors group {name!r}: weights {_describe(w)} are not supported; railyard loads "
                f"symmetric 8-bit float weights with channel, tensor or {BLOCK[0]}x{BLOCK[1]} block scales")
        a = group.get("input_activations")
        if a and not (a.get("num_bits") == 8 and a.get("type") == "float"):
            raise ModelLoadError(f"compressed-tensors group {name!r}: input activations {_describe(a)} are not "
                                 "supported (8-bit float only)")
        if a and not a.get("dynamic", False):
            log.info("compressed-tensors group %r has static activation scales: activations are quantized per "
                     "token instead", name)


def _describe(args: dict) -> str:
    keys = ("num_bits", "type", "strategy", "block_structure", "symmetric")
    return "(" + ", ".join(f"{k}={args.get(k)!r}" for k in keys if k in args) + ")"
