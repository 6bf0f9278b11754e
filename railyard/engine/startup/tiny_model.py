"""The embedded default model: a tiny random-weight checkpoint in Hugging Face layout.

Made deterministically from a seed (each tensor from its own name-seeded generator), with a
byte-level tokenizer and a ChatML chat template, and cached on disk. Used by the demo and the
tests; HF transformers loads it as it would any real checkpoint. Finding the cached model imports no torch (only
writing one does): a front process that only wants a named shape's tokenizer need not load torch for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from railyard.envs import cache_root

if TYPE_CHECKING:
    import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML; with `tools`, Qwen2.5's Hermes-style tool prompt, <tool_call> turns and <tool_response> results.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{{- call.arguments | tojson }}{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
DEFAULT_ARCH = "qwen2"

_BASE = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=False, torch_dtype="float32", bos_token_id=256, eos_token_id=[256, 258])
_ARCHS = {
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32, attention_bias=False,
                  tie_word_embeddings=True),
    # Mixture of experts: 8 experts, top-2 (renormalised), in layers 0, 1 and 3 (2 is in mlp_only_layers).
    "qwen3moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=32, attention_bias=False,
                     num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2]),
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False, mlp_bias=False,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=64)),
}


def default_cache_dir() -> Path:
    return cache_root()


def tiny_config(arch: str = DEFAULT_ARCH, **overrides) -> dict:
    if arch not in _ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(_ARCHS)}")
    return {**_BASE, **_ARCHS[arch], **overrides}


def weight_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nh
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (nh * d, h), p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h), p + "self_attn.o_proj.weight": (h, nh * d),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        shapes.update(_mlp_shapes(cfg, i, p + "mlp."))
        if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
            for n, size in (("q", nh * d), ("k", nkv * d), ("v", nkv * d)):
                shapes[p + f"self_attn.{n}_proj.bias"] = (size,)
        if cfg.get("attention_bias") and cfg["model_type"] != "qwen2":  # Qwen2's o_proj has none
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
    return shapes


def _mlp_shapes(cfg: dict, layer: int, p: str) -> dict[str, tuple[int, ...]]:
    """A layer's MLP tensors as HF checkpoints name them: dense, or a router and per-expert projections."""
    h, experts = cfg["hidden_size"], cfg.get("num_experts", 0)
    sparse = experts and layer not in cfg.get("mlp_only_layers", []) and (layer + 1) % cfg["decoder_sparse_step"] == 0
    if not sparse:
        inter = cfg["intermediate_size"]
        return {p + "gate_proj.weight": (inter, h), p + "up_proj.weight": (inter, h),
                p + "down_proj.weight": (h, inter)}
    inter = cfg["moe_intermediate_size"]
    shapes = {p + "gate.weight": (experts, h)}
    for e in range(experts):
        shapes.update({f"{p}experts.{e}.gate_proj.weight": (inter, h), f"{p}experts.{e}.up_proj.weight": (inter, h),
                       f"{p}experts.{e}.down_proj.weight": (h, inter)})
    return shapes


def random_tensor(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    noise = torch.randn(shape, generator=gen)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise  # not all ones, so a missed norm would show
    return noise * std


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 1024,
        "add_bos_token": False, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=1))


def write_tiny_checkpoint(path: str | Path, arch: str = DEFAULT_ARCH, seed: int = 0, std: float = 0.15,
                          num_shards: int = 1, **overrides) -> Path:
    """Write a tiny random checkpoint (config, safetensors weights, tokenizer) into `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(arch, **overrides)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"],
                                                             "bos_token_id": cfg["bos_token_id"]}))
    tensors = {n: random_tensor(n, s, seed, std) for n, s in weight_shapes(cfg).items()}
    names = sorted(tensors)
    if num_shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k in range(num_shards):
            fname = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[k::num_shards]}
            save_file(part, str(path / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_tokenizer(path)
    return path


def embedded_name(arch: str = DEFAULT_ARCH, seed: int = 0) -> str:
    """The embedded model's name: its cache directory's, so also what the server calls it by default."""
    return f"tiny-{arch}-seed{seed}"


def embedded_model_dir(name: str) -> Path | None:
    """The embedded model a name such as tiny-qwen2-seed0 stands for (made on first use), or None."""
    match = re.fullmatch(r"tiny-([a-z0-9]+)-seed(\d+)", name)
    if match is None or match[1] not in _ARCHS:
        return None
    return ensure_tiny_model(match[1], int(match[2]))


def ensure_tiny_model(arch: str = DEFAULT_ARCH, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The cached embedded model directory, created on first use (atomically, safe for parallel callers)."""
    root = cache_dir or default_cache_dir()
    target = root / embedded_name(arch, seed)
    config = target / "tokenizer_config.json"
    if config.is_file():
        if json.loads(config.read_text()).get("chat_template") != CHAT_TEMPLATE:  # cached by an older railyard
            tmp = config.with_name(f".{config.name}.{os.getpid()}")
            tmp.write_text(json.dumps(_tokenizer_config(), indent=1))
            os.replace(tmp, config)
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=root))
    write_tiny_checkpoint(tmp, arch, seed)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target
