"""`railyard bench throughput --num-loras N --lora-rank R`: what serving N LoRA adapters costs.

The same seeded workload runs twice in one process: on the base model alone (an engine without LoRA, unless
--no-lora-baseline), then on an engine with N random PEFT adapters of rank R (written for the model's shape to a
temporary directory), its requests spread evenly over the adapters. The report holds both runs' tokens/s, TTFT and
TPOT, and the LoRA run's share of the base model's tokens/s.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import tempfile
from pathlib import Path

from railyard.engine.config import EngineConfig
from railyard.engine.lora.peft import CONFIG_FILE, MODULES, WEIGHTS_FILE, module_shapes
from railyard.engine.lora.request import LoRARequest
from railyard.model.spec import ModelSpec


def write_random_adapters(spec: ModelSpec, root: Path, num: int, rank: int, modules: tuple[str, ...] = MODULES,
                          dtype: str = "bfloat16", seed: int = 0) -> list[LoRARequest]:
    """num PEFT adapters of rank `rank` on `modules` of every layer (random A and B, small enough to keep the
    activations finite), as PEFT saves them; their LoRA requests, ids 1..num."""
    import torch
    from safetensors.torch import save_file

    shapes = module_shapes(spec)
    torch_dtype = getattr(torch, dtype)
    requests = []
    for n in range(num):
        gen = torch.Generator().manual_seed(seed + n)
        tensors = {}
        for layer in range(spec.num_layers):
            for module in modules:
                if module in ("gate_proj", "up_proj", "down_proj") and spec.is_moe_layer(layer):
                    continue
                fan_in, fan_out = shapes[module]
                part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                key = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=gen) * fan_in ** -0.5) \
                    .to(torch_dtype)
                tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=gen) * 0.01).to(torch_dtype)
        path = root / f"adapter-{n}"
        path.mkdir(parents=True)
        save_file(tensors, str(path / WEIGHTS_FILE))
        (path / CONFIG_FILE).write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules),
            "bias": "none", "task_type": "CAUSAL_LM"}))
        requests.append(LoRARequest(f"adapter-{n}", n + 1, str(path)))
    return requests


def run_lora_throughput(config: EngineConfig, run, num_loras: int, lora_rank: int, baseline: bool = True) -> dict:
    """`run(engine, loras)` (the throughput run, loras one per request or None) on the base engine, then on the
    engine with num_loras adapters; the report of both."""
    from railyard.engine.core.engine_core import EngineCore
    from railyard.engine.engine import Engine

    report: dict = {"num_loras": num_loras, "lora_rank": lora_rank}
    if baseline:
        report["base"] = _run_once(dataclasses.replace(config, enable_lora=False), run, 0, lora_rank)
    lora_config = dataclasses.replace(config, enable_lora=True, max_loras=max(config.max_loras, num_loras),
                                      max_lora_rank=max(config.max_lora_rank, lora_rank))
    report["lora"] = _run_once(lora_config, run, num_loras, lora_rank)
    if baseline:
        base, lora = report["base"]["output_tokens_per_s"], report["lora"]["output_tokens_per_s"]
        report["lora_over_base_output_tokens_per_s"] = round(lora / base, 4) if base else None
    return report


def _run_once(config: EngineConfig, run, num_loras: int, lora_rank: int) -> dict:
    """One engine's run (with num_loras random adapters loaded), its device memory freed after."""
    from railyard.engine.engine import Engine

    engine = Engine.from_config(config)
    try:
        with tempfile.TemporaryDirectory(prefix="railyard-lora-bench-") as root:
            loras = None
            if num_loras:
                runner = getattr(engine.executor, "runner", None)
                dtype = str(runner.dtype).removeprefix("torch.") if runner is not None else "bfloat16"
                loras = write_random_adapters(engine.spec, Path(root), num_loras, lora_rank, dtype=dtype)
                for lora in loras:
                    engine.load_lora(lora)
            return run(engine, loras)
    finally:
        engine.shutdown()
        del engine
        _free_device_memory()


def _free_device_memory() -> None:
    """Give a finished engine's device memory back before the next engine profiles what is left."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
