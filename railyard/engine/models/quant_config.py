"""Which pre-quantized checkpoint formats load: the `quantization_config` of an HF config.json.

Two FP8 formats that vLLM loads, both as float8_e4m3fn weights with float32 `weight_scale` tensors:
- vLLM's Fp8Config (`quant_method: "fp8"`, AutoFP8 / llm-compressor's older export): one scale per
  weight tensor (q, k and v each their own), `activation_scheme` dynamic or static;
- compressed-tensors (`quant_method: "compressed-tensors"`, format float-quantized): FP8 weights with
  `strategy` channel (scale [out, 1]) or tensor, activations FP8 per token (dynamic) or per tensor (static).
Static activation scales (`input_scale`) are not used: activations are always quantized per token on the
fly, which is at least as accurate. Block-wise scales (`weight_block_size`, strategy block) and every
non-FP8 scheme are refused with a clear error. Torch-free, like ModelSpec.
"""

from __future__ import annotations

import logging

from railyard.errors import ModelLoadError

log = logging.getLogger("railyard.engine")

_FORMATS = ("float-quantized", "naive-quantized")


def checkpoint_quantization(cfg: dict) -> str | None:
    """"fp8" for an FP8 checkpoint in a supported format, None for an unquantized one."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise ModelLoadError("config.json: quantization_config must be an object")
    method = qc.get("quant_method")
    if method == "fp8":
        _check_fp8_method(qc)
    elif method == "compressed-tensors":
        _check_compressed_tensors(qc)
    else:
        raise ModelLoadError(f"quantization method {method!r} is not supported; railyard loads FP8 checkpoints "
                             "(quant_method 'fp8', or 'compressed-tensors' with FP8 channel or tensor scales)")
    return "fp8"


def _check_fp8_method(qc: dict) -> None:
    if qc.get("weight_block_size"):
        raise ModelLoadError(f"block-wise FP8 scales (weight_block_size {qc['weight_block_size']}) are not "
                             "supported; railyard loads per-tensor or per-channel FP8 scales")
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
        if not (w.get("num_bits") == 8 and w.get("type") == "float" and w.get("strategy") in ("channel", "tensor")
                and w.get("symmetric", True)):
            raise ModelLoadError(
                f"compressed-tensors group {name!r}: weights {_describe(w)} are not supported; railyard loads "
                "symmetric 8-bit float weights with channel or tensor scales")
        a = group.get("input_activations")
        if a and not (a.get("num_bits") == 8 and a.get("type") == "float"):
            raise ModelLoadError(f"compressed-tensors group {name!r}: input activations {_describe(a)} are not "
                                 "supported (8-bit float only)")
        if a and not a.get("dynamic", False):
            log.info("compressed-tensors group %r has static activation scales: activations are quantized per "
                     "token instead", name)


def _describe(args: dict) -> str:
    keys = ("num_bits", "type", "strategy", "symmetric")
    return "(" + ", ".join(f"{k}={args.get(k)!r}" for k in keys if k in args) + ")"
