"""HF transformers as the oracle: greedy continuations from `generate` on the same checkpoint."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import transformers


@functools.lru_cache(maxsize=8)
def hf_model(path: str):
    transformers.logging.set_verbosity_error()
    quant = json.loads((Path(path) / "config.json").read_text()).get("quantization_config") or {}
    # MXFP4 experts (gpt-oss): HF widens them to float32 as it loads (without a GPU it has no MXFP4 kernels).
    extra = {"quantization_config": transformers.Mxfp4Config(dequantize=True)} \
        if quant.get("quant_method") == "mxfp4" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra).eval()
    # Some versions (5.17 among them) widen MXFP4 experts to bfloat16 whatever the model's dtype and run them so;
    # e2m1 times a power of two is exact in bfloat16, so float32 again gives every version the same float32 experts.
    model.float()
    model.generation_config.eos_token_id = None  # compare fixed-length continuations (ignore_eos)
    return model


def hf_greedy(path: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF `generate` greedy, one prompt at a time (no padding that could perturb numerics)."""
    model = hf_model(path)
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=0)
            outs.append(y[0, len(ids):].tolist())
    return outs
