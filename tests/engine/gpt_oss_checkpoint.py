"""Tiny random gpt-oss checkpoints in HF layout: made by HF transformers' own GptOssForCausalLM (its tensor names and
layouts), optionally with MXFP4 experts as the real checkpoints ship them (`*_blocks` / `*_scales`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

from railyard.engine.runner.layers.mxfp4 import quantize_mxfp4
from railyard.engine.startup.tiny_model import write_tokenizer

WINDOW = 16  # prompts in the tests run past it
TINY = dict(vocab_size=259, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW,
            max_position_embeddings=1024, initializer_range=0.15, rms_norm_eps=1e-5, tie_word_embeddings=False,
            eos_token_id=[256, 258], bos_token_id=256, pad_token_id=257,
            rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                 original_max_position_embeddings=32, rope_theta=150000.0))
# The real checkpoints' quantization_config (gpt-oss-20b / 120b config.json).
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def write_tiny_gpt_oss(path: str | Path, mxfp4: bool = False, seed: int = 0, **overrides) -> Path:
    """A tiny gpt-oss checkpoint: float32 weights (biases, sinks and norms random too), or with mxfp4 its experts'
    gate_up_proj and down_proj as MXFP4 blocks and scales (everything else float32)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = GptOssConfig(**{**TINY, **overrides})
    model = GptOssForCausalLM(config).float()
    tensors = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    gen = torch.Generator().manual_seed(seed + 1)
    for name, t in tensors.items():
        if name.endswith("norm.weight"):  # not all ones, so a missed norm would show
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=gen))
        elif name.endswith("bias"):  # HF initialises expert biases to zero: a missed one would not show
            t.copy_(0.1 * torch.randn(t.shape, generator=gen))
    if mxfp4:
        for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2))  # stored [E, out, in]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks.contiguous(), scales.contiguous()
    model.config.architectures = ["GptOssForCausalLM"]
    model.config.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    if mxfp4:
        cfg["quantization_config"] = MXFP4_CONFIG
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(path)
    return path
