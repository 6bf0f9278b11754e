"""Load an HF-format checkpoint directory: config.json + safetensors (single file or sharded index).

Only local directories: weights are never downloaded at run time. safetensors only (no pickle).
Which files those are is railyard.engine.runner.models.checkpoint_dir's job (torch-free, for the front).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch

from railyard.engine.runner.layers.fp8 import FP8, quantize_rows
from railyard.engine.runner.layers.moe import FusedMoE, quantize_experts
from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir, weight_files  # noqa: F401 (re-exported)
from railyard.engine.runner.models.decoder import CausalLM
from railyard.engine.runner.models.safetensors_reader import CheckpointReader
from railyard.engine.runner.layers.parallel import SINGLE, ParallelState
from railyard.engine.startup.timings import WeightLoad
from railyard.errors import ModelLoadError
from railyard.model.spec import ModelSpec



def iter_weights(files: list[Path], reader: CheckpointReader | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield tensors one at a time (CPU tensors of the mapped files), so a rank holds at most one full tensor beside
    its shards."""
    reader = reader or CheckpointReader()
    for file in files:
        try:
            yield from reader.iter_file(file)
        except ModelLoadError:
            raise
        except OSError as exc:
            raise ModelLoadError(f"cannot read weights from {file}: {exc}") from None


def build_empty(spec: ModelSpec, dtype: torch.dtype, device: torch.device, backend_cls,
                ps: ParallelState = SINGLE) -> CausalLM:
    """The model's modules on `device` in `dtype`, weights uninitialised (rotary tables stay float32;
    with spec.quantization "fp8" the decoder's linear weights are float8 with float32 scales)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return CausalLM(spec, backend_cls, ps).eval()
    finally:
        torch.set_default_dtype(previous)


def load_model(model_dir: Path, spec: ModelSpec, dtype: torch.dtype, device: torch.device, backend_cls,
               ps: ParallelState = SINGLE) -> CausalLM:
    """Build the model on `device` in `dtype` and fill it from the checkpoint."""
    model = build_empty(spec, dtype, device, backend_cls, ps)
    fill_from_checkpoint(model, model_dir)
    return model


def fill_from_checkpoint(model: CausalLM, model_dir: Path) -> WeightLoad:
    """Fill a built model's weights from the checkpoint; returns the bytes read and where the time went. Raises
    ModelLoadError if the checkpoint lacks any of the model's weights."""
    reader = CheckpointReader()
    start = time.perf_counter()
    loaded = model.load_weights(iter_weights(weight_files(model_dir), reader))
    _weights_filled(model)
    seconds = time.perf_counter() - start
    expected = {n for n, _ in model.named_parameters()}
    missing = sorted(expected - loaded)
    if missing:
        raise ModelLoadError(f"{model_dir}: checkpoint lacks weights for {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    # What the reader did not take of the load's time, the model took: converting and copying into parameters.
    return WeightLoad(reader.bytes_read, reader.name, reader.read_s, reader.to_device_s,
                      max(0.0, seconds - reader.read_s - reader.to_device_s))


def random_weights(model: CausalLM, seed: int, std: float = 0.02) -> CausalLM:
    """Fill a model with seeded random weights (GPU benchmarks of a named shape: no weights travel).

    An FP8 layer draws the very numbers the unquantized model's layer draws (same shape, dtype and
    generator stream) and quantizes them, so FP8 and bf16 models of one seed can be compared."""
    dtype = model.model.embed_tokens.weight.dtype
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    params = dict(model.named_parameters())
    for name, param in params.items():
        if name.endswith("weight_scale") and param.dtype != torch.uint8:
            continue  # set with its weight (FP8)
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif param.dtype == torch.uint8:  # MXFP4 experts: random e2m1 pairs, exponents of 2^-7 (|w| <= 0.047)
            if name.endswith("weight_scale"):
                param.data.fill_(120)
            else:
                param.data.copy_(torch.randint(0, 256, param.shape, generator=gen, device=param.device,
                                               dtype=torch.uint8))
        elif param.dtype == FP8:
            full = torch.empty(param.shape, dtype=dtype, device=param.device).normal_(0.0, std, generator=gen)
            if param.dim() == 3:  # stacked experts: block scales
                quantize_experts(full, param, params[name + "_scale"])
                continue
            q, scale = quantize_rows(full)
            param.data.copy_(q)
            params[name + "_scale"].data.copy_(scale)
        else:
            param.data.normal_(0.0, std, generator=gen)
    for module in model.modules():
        if isinstance(module, FusedMoE):
            module.clear_padding()  # a rank's padded expert columns stay zero, as a checkpoint's load leaves them
    _weights_filled(model)
    return model


def _weights_filled(model: CausalLM) -> None:
    """What a layer does to weights once they are written (MXFP4 experts: the fused kernel's byte order)."""
    for module in model.modules():
        if isinstance(module, FusedMoE):
            module.weights_filled()
