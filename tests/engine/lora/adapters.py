"""Real PEFT adapters for the tiny checkpoints (peft's get_peft_model + save_pretrained), and HF transformers + peft
as the oracle of what they generate."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers

peft = pytest.importorskip("peft")

# Three adapters that differ in rank, targets and scaling (one rsLoRA); B is random, so each changes the output.
ADAPTERS = {
    "attn-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "mlp-r16": dict(r=16, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "mixed-r4-rslora": dict(r=4, lora_alpha=4, use_rslora=True, target_modules=["q_proj", "v_proj", "up_proj",
                                                                                 "down_proj", "o_proj"]),
}


def write_adapter(model_dir: str, out_dir: Path, seed: int = 0, b_std: float = 0.3, **lora_config) -> str:
    """A PEFT LoRA adapter for the checkpoint at model_dir, saved as adapter_config.json + adapter_model.safetensors,
    with random A (PEFT's init) and random non-zero B."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **lora_config))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * b_std)
    peft_model.save_pretrained(str(out_dir))
    return str(out_dir)


@functools.lru_cache(maxsize=16)
def _peft_model(model_dir: str, adapter_dir: str | None):
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
    return model


def peft_greedy(model_dir: str, adapter_dir: str | None, prompts: list[list[int]], max_new_tokens: int) \
        -> list[list[int]]:
    """HF `generate` greedy with the adapter applied by peft (None: the base model), one prompt at a time."""
    model = _peft_model(model_dir, adapter_dir)
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
            outs.append(y[0, len(ids):].tolist())
    return outs
