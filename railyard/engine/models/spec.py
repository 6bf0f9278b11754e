"""The architecture facts of a Llama-family checkpoint, read from its HF config.json."""

from __future__ import annotations

from dataclasses import dataclass

from railyard.engine.models.quant_config import checkpoint_quantization
from railyard.errors import ModelLoadError

# architecture name -> (qkv bias, per-head q/k RMSNorm)
_ARCHITECTURES = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
}


@dataclass(frozen=True)
class ModelSpec:
    """Everything the decoder needs to build itself; plain data."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    torch_dtype: str
    eos_token_ids: tuple[int, ...]
    quantization: str | None = None  # "fp8": the checkpoint's linear weights are already FP8 (quant_config.py)

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelSpec":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in _ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {', '.join(_ARCHITECTURES)}"
            )
        if cfg.get("use_sliding_window"):
            raise ModelLoadError("sliding-window attention (use_sliding_window: true) is not supported")
        bias, qk_norm = _ARCHITECTURES[arch]
        if cfg.get("mlp_bias"):
            raise ModelLoadError("mlp_bias: true is not supported")
        try:
            heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            rope = cfg.get("rope_parameters") or {}
            scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            eos = cfg.get("eos_token_id")
            return cls(
                architecture=arch,
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_layers=cfg["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or hidden // heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=scaling,
                max_position_embeddings=cfg.get("max_position_embeddings", 4096),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v bias; the others say so in config.json.
                attention_bias=bias or bool(cfg.get("attention_bias", False)),
                qk_norm=qk_norm,
                torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
                eos_token_ids=tuple(eos if isinstance(eos, list) else ([eos] if eos is not None else [])),
                quantization=checkpoint_quantization(cfg),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required field {exc}") from None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token at 2-byte precision (for sizing)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2
