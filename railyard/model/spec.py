"""The one description of a model: architecture, dimensions, precision, parsed once from HF config.json.

Torch-free plain data. The engine builds its decoder from it, the roofline counts FLOPs and bytes from it
and the planner sizes weights and KV cache from it. What railyard can run is decided here too (and in
`check_tensor_parallel` / `check_max_model_len`), so `railyard plan` refuses exactly the configs
`railyard serve` refuses, with the same message.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railyard.errors import ConfigError, ModelLoadError
from railyard.model.kv_fit import blocks_to_hold
from railyard.model.precision import (DTYPE_BYTES, KV_CACHE_DTYPE_BYTES, QUANTIZATION_BYTES, QUANTIZATION_SCALE_BYTES,
                                      check_kv_cache_dtype, check_quantization, resolve_dtype)
from railyard.model.quant_config import (checkpoint_block_scales, checkpoint_expert_quantization,
                                         checkpoint_quantization)

# architecture name -> (q/k/v/o biases, per-head q/k RMSNorm), as HF's modeling code builds them: "qkv" always on
# q/k/v only (Qwen2), "config" on all four when config.json's attention_bias says so (default true for gpt-oss only),
# None never (Mistral's modeling code ignores attention_bias).
ARCHITECTURES = {
    "LlamaForCausalLM": ("config", False),
    "MistralForCausalLM": (None, False),
    "Qwen2ForCausalLM": ("qkv", False),
    "Qwen3ForCausalLM": ("config", True),
    "Qwen3MoeForCausalLM": ("config", True),
    "GptOssForCausalLM": ("config", False),
}
# MXFP4 weights share one exponent per group of this many; a weight's bytes count its share of that exponent byte.
MXFP4_GROUP = 32
MXFP4_WEIGHT_BYTES = 0.5 + 1 / MXFP4_GROUP
# A step whose (token, expert) slots reach this many per expert on average multiplies each MXFP4 expert weight by
# enough rows that the tensor cores bound its GEMMs, not the weights' bytes: the GPU then widens one projection's
# experts at a time into a transient buffer of the model's dtype and runs the dense-weight GEMM (kernels/fused_moe.py).
MXFP4_WIDEN_SLOTS_PER_EXPERT = 512
# FP8 experts carry one float32 scale per block of this many output x input weights (as FP8 MoE checkpoints such as
# Qwen3-30B-A3B-FP8 ship them, and as --quantization fp8 quantizes a bf16 checkpoint's experts).
EXPERT_BLOCK = (128, 128)
# rope scaling type -> the keys it needs (besides rope_type)
ROPE_TYPES: dict[str, tuple[str, ...]] = {"default": (), "linear": ("factor",), "llama3": ("factor",),
                                          "yarn": ("factor", "original_max_position_embeddings")}


@dataclass(frozen=True)
class ModelSpec:
    """Everything the decoder needs to build itself, and what a weight and a KV element occupy; plain data."""

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
    torch_dtype: str  # as the checkpoint says
    eos_token_ids: tuple[int, ...]
    # Precision of a run (with_precision); from config.json: the checkpoint's own.
    dtype: str = "bfloat16"  # activations and unquantized weights
    kv_cache_dtype: str = "auto"  # "auto": the model dtype
    # Quantized linear-layer weights (None: unquantized); "fp8": float8 weights with float32 per-channel scales,
    # from an FP8 checkpoint's quantization_config (model/quant_config.py) or quantized as the engine loads.
    quantization: str | None = None
    # The FP8 checkpoint's weights carry one scale per EXPERT_BLOCK (model/quant_config.py): experts keep them, other
    # layers' weights are converted to per-channel scales as they load.
    block_scaled_checkpoint: bool = False
    # Mixture of experts (num_experts 0: every layer's MLP is dense). A token's MLP in an MoE layer is the
    # routing-weighted sum of num_experts_per_tok experts of width moe_intermediate_size, chosen by a router
    # (softmax over the experts' logits, top-k, renormalised to sum 1 when norm_topk_prob).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is the experts (HF's decoder_sparse_step, mlp_only_layers)
    # Sliding-window attention (gpt-oss alternates it with full attention by layer): the layers in sliding_layers
    # see the last sliding_window tokens (the query's own included). Their KV blocks are kept apart from the full
    # layers' and freed once the window has passed them (engine/sched/block_manager.py); each shares a cache tensor
    # with a full-attention layer (kv_tensor_of).
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    attention_sinks: bool = False  # a learned logit per head in each attention softmax's denominator (gpt-oss)
    o_proj_bias: bool = False  # the attention output projection has a bias (attention_bias on Llama, Qwen3, gpt-oss)
    # gpt-oss's experts: the router and every expert projection carry biases; the activation is a clamped SwiGLU
    # (alpha, limit); expert weights may be MXFP4 as the checkpoints ship them ("mxfp4"; layers/mxfp4.py).
    moe_bias: bool = False
    swiglu: tuple[float, float] | None = None
    expert_quantization: str | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelSpec":
        """Parse and check an HF config.json mapping; ModelLoadError says what railyard cannot run and why."""
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        if cfg.get("use_sliding_window"):
            raise ModelLoadError("sliding-window attention (use_sliding_window: true) is not supported")
        biases, qk_norm = ARCHITECTURES[arch]
        o_bias = biases == "config" and bool(cfg.get("attention_bias", arch == "GptOssForCausalLM"))
        qkv_bias = biases == "qkv" or o_bias
        if cfg.get("mlp_bias"):
            raise ModelLoadError("mlp_bias: true is not supported")
        try:
            heads = _positive(cfg, "num_attention_heads")
            hidden = _positive(cfg, "hidden_size")
            rope = cfg.get("rope_parameters") or {}
            scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            eos = cfg.get("eos_token_id")
            torch_dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
            spec = cls(
                architecture=arch,
                vocab_size=_positive(cfg, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_positive(cfg, "intermediate_size"),
                num_layers=_positive(cfg, "num_hidden_layers"),
                num_heads=heads,
                num_kv_heads=_positive(cfg, "num_key_value_heads", heads),
                head_dim=_positive(cfg, "head_dim", hidden // heads),
                rms_norm_eps=_number(cfg, "rms_norm_eps", 1e-6),
                rope_theta=_number(cfg, "rope_theta", rope.get("rope_theta", 10000.0)),
                rope_scaling=scaling,
                max_position_embeddings=_positive(cfg, "max_position_embeddings", 4096),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=qkv_bias,
                o_proj_bias=o_bias,
                qk_norm=qk_norm,
                torch_dtype=torch_dtype,
                eos_token_ids=_token_ids(eos),
                dtype=resolve_dtype("auto", torch_dtype, "cuda"),
                quantization=checkpoint_quantization(cfg),
                block_scaled_checkpoint=checkpoint_block_scales(cfg),
                **(_gpt_oss_fields(cfg) if arch == "GptOssForCausalLM" else _moe_fields(cfg)),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required field {exc}") from None
        if spec.num_heads % spec.num_kv_heads:
            raise ModelLoadError(f"config.json: num_attention_heads {spec.num_heads} is not a multiple of "
                                 f"num_key_value_heads {spec.num_kv_heads}")
        if spec.head_dim % 2:
            raise ModelLoadError(f"config.json: head_dim {spec.head_dim} is odd; rotary embeddings need an even one")
        check_rope_scaling(scaling)
        return spec

    def with_precision(self, dtype: str = "auto", kv_cache_dtype: str = "auto", quantization: str | None = None,
                       device_type: str = "cuda") -> "ModelSpec":
        """This model as a run stores it: dtype "auto" is the checkpoint's (float32 on the CPU); quantization
        None keeps the checkpoint's own. ConfigError for a precision railyard does not run."""
        return dataclasses.replace(
            self, dtype=resolve_dtype(dtype, self.torch_dtype, device_type),
            kv_cache_dtype=check_kv_cache_dtype(kv_cache_dtype),
            quantization=self.quantization if quantization is None else check_quantization(quantization))

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_element_bytes(self) -> int:
        """Bytes of one stored K or V element."""
        return KV_CACHE_DTYPE_BYTES.get(self.kv_cache_dtype, self.dtype_bytes)

    @property
    def linear_weight_bytes(self) -> int:
        """Bytes of one weight of the decoder layers' projections (quantized ones: the method's size)."""
        return QUANTIZATION_BYTES[self.quantization] if self.quantization else self.dtype_bytes

    @property
    def matmul_precision(self) -> str:
        """What the projections multiply in: the quantization method, or the model dtype (sets the FLOP rate)."""
        return self.quantization or self.dtype

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads a tensor-parallel rank holds (replicated when there are fewer heads than ranks)."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """K and V of one token in every layer, on one tensor-parallel rank."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * self.kv_element_bytes

    def kv_bytes_per_block(self, block_size: int, tp: int = 1) -> int:
        """One KV-cache block on one rank: 2 (K and V) * cache tensors * kv_heads * head_dim * block. A sliding-window
        layer shares its tensor with a full-attention one, so a block is one layer of each kind."""
        return 2 * self.num_kv_tensors * self.kv_heads_per_rank(tp) * self.head_dim * self.kv_element_bytes * block_size

    # -- sliding-window layers -------------------------------------------------------------------------
    @property
    def kv_sliding_window(self) -> int | None:
        """The window sliding layers' KV blocks are kept for (None: no sliding layers, every block is kept)."""
        return self.sliding_window if self.sliding_layers else None

    @property
    def num_kv_tensors(self) -> int:
        """KV-cache tensors: one per layer, except that the i-th sliding-window layer shares the i-th full-attention
        layer's (a block serves one of them at a time: engine/sched/block_manager.py)."""
        sliding = len(self.sliding_layers)
        return max(sliding, self.num_layers - sliding) if sliding else self.num_layers

    def kv_tensor_of(self, layer: int) -> int:
        """The cache tensor a layer keeps its KV in: its index among the layers of its kind."""
        sliding = layer in self.sliding_layers
        return sum(1 for i in range(layer) if (i in self.sliding_layers) == sliding)

    def kv_blocks_per_sequence(self, num_tokens: int, block_size: int) -> int:
        """KV blocks a decoding sequence of num_tokens holds: all of its full layers', and in the sliding layers those
        the next token's window sees (with the block it is written to): kv_fit's rule for a step of one token."""
        return blocks_to_hold(num_tokens, 1, block_size, self.kv_sliding_window)

    def kv_bytes_read(self, context_len: int, tp: int = 1) -> int:
        """K and V bytes one decode query reads on one rank over a context of context_len tokens: every token in the
        full layers, the window's in the sliding ones."""
        per_layer_token = 2 * self.kv_heads_per_rank(tp) * self.head_dim * self.kv_element_bytes
        sliding = len(self.sliding_layers)
        seen = min(context_len, self.sliding_window) if sliding else 0
        return per_layer_token * ((self.num_layers - sliding) * context_len + sliding * seen)

    # -- mixture of experts -------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - len(self.moe_layers)

    def expected_experts_hit(self, tokens: float) -> float:
        """How many distinct experts `tokens` tokens route to in one layer, expected under uniform routing (each
        token picks top-k distinct experts uniformly at random): E * (1 - (1 - k/E)^tokens). Real routers are not
        uniform (popular experts absorb more), so this is a floor's estimate, not a bound."""
        if not self.num_experts or tokens <= 0:
            return 0.0
        return self.num_experts * (1.0 - (1.0 - self.num_experts_per_tok / self.num_experts) ** tokens)

    # -- parameters, per tensor-parallel rank as the engine shards them --------------------------------
    def attention_linear_params(self, tp: int = 1) -> int:
        """One layer's attention projections on one rank: fused QKV and o."""
        h, d = self.hidden_size, self.head_dim
        qkv = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * d * h
        return qkv + (self.num_heads // tp) * d * h

    def dense_mlp_params(self, tp: int = 1) -> int:
        """One dense MLP (gate/up, down) on one rank."""
        return 3 * self.hidden_size * (self.intermediate_size // tp)

    def expert_intermediate(self, tp: int = 1) -> int:
        """The width of every expert's intermediate slice one rank holds (MXFP4's padded to whole groups)."""
        group = MXFP4_GROUP if self.expert_quantization == "mxfp4" else 1
        return expert_shard(self.moe_intermediate_size, tp, 0, group).held

    def expert_params(self, tp: int = 1) -> int:
        """One expert (gate/up, down) on one rank: each rank holds a slice of every expert's intermediate width."""
        return 3 * self.hidden_size * self.expert_intermediate(tp)

    def layer_linear_params(self, tp: int = 1, layer: int = 0) -> int:
        """One decoder layer's projection weights on one rank: fused QKV, o, and its MLP's gate/up and down (an
        MoE layer's: every expert's; the router is not counted here: it stays in the model dtype)."""
        mlp = self.num_experts * self.expert_params(tp) if self.is_moe_layer(layer) else self.dense_mlp_params(tp)
        return self.attention_linear_params(tp) + mlp

    def linear_params(self, tp: int = 1) -> int:
        """All decoder layers' projection weights on one rank (what quantization stores at its precision)."""
        return sum(self.layer_linear_params(tp, i) for i in range(self.num_layers))

    def layer_linear_outputs(self, tp: int = 1) -> int:
        """Output channels of one dense decoder layer's projections on one rank (each carries a scale when
        quantized): fused QKV and gate/up are split over ranks, o and down are not (row-parallel: split by input)."""
        qkv = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        return qkv + self.hidden_size + 2 * (self.intermediate_size // tp) + self.hidden_size

    def linear_scale_bytes(self, tp: int = 1) -> int:
        """Bytes of the quantized projections' float32 scales on one rank: one per output channel of attention and
        dense MLPs, one per EXPERT_BLOCK of every expert's gate, up and down (0 unquantized)."""
        per = QUANTIZATION_SCALE_BYTES.get(self.quantization, 0)
        if not per:
            return 0
        dense = self.layer_linear_outputs(tp)
        attention = dense - 2 * (self.intermediate_size // tp) - self.hidden_size
        bn, bk = EXPERT_BLOCK
        h, inter = self.hidden_size, self.moe_intermediate_size // tp
        expert = 2 * _cdiv(inter, bn) * _cdiv(h, bk) + _cdiv(h, bn) * _cdiv(inter, bk)
        moe = len(self.moe_layers)
        return per * (self.num_dense_layers * dense + moe * (attention + self.num_experts * expert))

    def layer_other_params(self, tp: int = 1, layer: int = 0) -> int:
        """One decoder layer's biases, norms, router and sinks on one rank (kept in the model dtype)."""
        d, h = self.head_dim, self.hidden_size
        bias = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * d if self.attention_bias else 0
        router = self.num_experts * h if self.is_moe_layer(layer) else 0
        if self.moe_bias and self.is_moe_layer(layer):  # router bias, each expert's gate/up and down biases
            router += self.num_experts * (1 + 2 * self.expert_intermediate(tp) + h)
        extra = (h if self.o_proj_bias else 0) + (self.num_heads // tp if self.attention_sinks else 0)
        return bias + 2 * h + (2 * d if self.qk_norm else 0) + router + extra

    def vocab_params(self, tp: int = 1) -> int:
        """Embedding and (untied) LM head on one rank: each holds a vocabulary slice."""
        rows = -(-self.vocab_size // tp)
        return rows * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def num_params(self, tp: int = 1) -> int:
        """Parameters one rank holds (tp=1: the model's parameter count, every expert included)."""
        other = sum(self.layer_other_params(tp, i) for i in range(self.num_layers))
        return self.linear_params(tp) + other + self.vocab_params(tp) + self.hidden_size

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of the weights one rank holds (all experts): projections at their stored precision (with their
        scales when quantized; MXFP4 experts with their exponents), the rest in the dtype."""
        linear = self.linear_params(tp)
        rest = self.num_params(tp) - linear
        experts = len(self.moe_layers) * self.num_experts * self.expert_params(tp)
        return int((linear - experts) * self.linear_weight_bytes + experts * self.expert_weight_bytes
                   + self.linear_scale_bytes(tp) + rest * self.dtype_bytes)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one expert weight as stored: MXFP4's (with its exponent's share), else the projections'."""
        return MXFP4_WEIGHT_BYTES if self.expert_quantization == "mxfp4" else self.linear_weight_bytes

    # -- per-token work (the roofline) -------------------------------------------------------------------
    @property
    def active_linear_params(self) -> int:
        """Projection weights one token multiplies by in the decoder layers: attention, dense MLPs, its top-k
        experts and the routers."""
        moe = len(self.moe_layers)
        per_moe = self.num_experts_per_tok * self.expert_params() + self.num_experts * self.hidden_size
        return (self.num_layers * self.attention_linear_params() + self.num_dense_layers * self.dense_mlp_params()
                + moe * per_moe)

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: the decoder layers' active projections and the LM head (not the embedding
        gather)."""
        return self.active_linear_params + self.vocab_size * self.hidden_size

    @property
    def matmul_weight_bytes(self) -> int:
        """Bytes of every weight a step's matmuls may read: all projections (every expert) at their precision, the
        routers and the LM head in the dtype (a quantized projection's scales are left out: 0.1-0.3% of the named
        shapes')."""
        return self.step_weight_bytes(float("inf"))

    def step_weight_bytes(self, tokens: float) -> float:
        """Bytes of weights a step of `tokens` tokens reads for its matmuls: everything but the experts, and in
        each MoE layer the experts its tokens route to (expected_experts_hit; all of them for a dense model's or
        an unbounded step's count)."""
        experts = self.num_experts if tokens == float("inf") else self.expected_experts_hit(tokens)
        moe = len(self.moe_layers)
        projections = self.num_layers * self.attention_linear_params() + self.num_dense_layers * self.dense_mlp_params()
        routers = moe * self.num_experts * self.hidden_size
        return (projections * self.linear_weight_bytes + moe * experts * self.expert_params() * self.expert_weight_bytes
                + (routers + self.vocab_size * self.hidden_size) * self.dtype_bytes)

    def attention_flops(self, query_positions: float, keys: float) -> float:
        """QK^T and PV for `query_positions` queries that each see `keys` keys on average in every layer."""
        return 4.0 * query_positions * keys * self.head_dim * self.num_heads * self.num_layers

    def prefill_attention_flops(self, num_tokens: int) -> float:
        """QK^T and PV of a whole prompt: each query over the keys it sees (all before it; in a sliding-window
        layer at most the window's)."""
        per_key = 4.0 * self.head_dim * self.num_heads
        sliding, w, n = len(self.sliding_layers), self.sliding_window or 0, num_tokens
        causal = n * (n + 1) / 2
        windowed = causal if n <= w else w * (w + 1) / 2 + (n - w) * w
        return per_key * ((self.num_layers - sliding) * causal + sliding * windowed)

    def decode_attention_flops(self, context_len: int) -> float:
        """QK^T and PV of one decode query over a context of context_len tokens (the window's in sliding layers)."""
        sliding = len(self.sliding_layers)
        seen = min(context_len, self.sliding_window) if sliding else 0
        return 4.0 * self.head_dim * self.num_heads * ((self.num_layers - sliding) * context_len + sliding * seen)


def read_model_spec(model_dir: str | Path) -> ModelSpec:
    """The description of a checkpoint directory's config.json (ModelLoadError if unreadable or unsupported)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{model_dir} has no config.json: not an HF-format checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return ModelSpec.from_hf_config(cfg)


def check_rope_scaling(scaling: dict | None) -> None:
    """Refuse rope scaling the rotary embedding does not implement, before any weights load."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"config.json: rope_scaling must be an object, got {scaling!r}")
    kind = rope_type(scaling)
    if kind not in ROPE_TYPES:
        raise ModelLoadError(f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    for key in ROPE_TYPES[kind]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ModelLoadError(f"config.json: rope_scaling {kind} needs a positive {key}, got {value!r}")


def rope_type(scaling: dict | None) -> str:
    """The rope scaling type of a rope_scaling mapping (HF spells it rope_type or, older, type)."""
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


@dataclass(frozen=True)
class ExpertShard:
    """One rank's slice of an expert's intermediate width: `real` columns from `start`, held in `held` (the same for
    every rank; past `real`, zero padding that adds nothing)."""

    start: int
    real: int
    held: int


def widens_mxfp4(slots: int, num_experts: int) -> bool:
    """Whether a call of this many (token, expert) slots widens MXFP4 experts for its GEMMs (the GPU's fused experts,
    and what the planner counts for them): MXFP4_WIDEN_SLOTS_PER_EXPERT per expert on average, or more."""
    return slots >= MXFP4_WIDEN_SLOTS_PER_EXPERT * num_experts


def expert_shard(intermediate: int, tp: int, rank: int, group: int = 1) -> ExpertShard:
    """Rank `rank`'s slice when the width splits into `tp` slices of whole `group`s (MXFP4: 32, its exponent's span):
    each rank holds ceil(groups / tp) of them, the last ranks fewer real ones, as vLLM splits gpt-oss's 2880 over
    4 or 8 ranks. A width that divides evenly gives every rank intermediate / tp, unpadded."""
    groups = intermediate // group
    per_rank = -(-groups // tp)
    start = min(rank * per_rank, groups)
    return ExpertShard(start * group, min(per_rank, groups - start) * group, per_rank * group)


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Refuse tensor-parallel sizes the model cannot be split into, before any process starts."""
    problems = []
    if spec.num_heads % tp:
        problems.append(f"{spec.num_heads} attention heads")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        problems.append(f"{spec.num_kv_heads} KV heads (neither divides the other)")
    if spec.num_dense_layers and spec.intermediate_size % tp:
        problems.append(f"intermediate size {spec.intermediate_size}")
    # MXFP4 experts split by whole 32-weight groups, the last ranks' slices zero-padded (expert_shard): any tp works
    if spec.is_moe and spec.expert_quantization != "mxfp4" and spec.moe_intermediate_size % tp:
        problems.append(f"expert intermediate size {spec.moe_intermediate_size}")
    elif spec.is_moe and spec.quantization and tp > 1 and (spec.moe_intermediate_size // tp) % EXPERT_BLOCK[0]:
        problems.append(f"FP8 experts' {EXPERT_BLOCK[0]}-wide scale blocks (expert intermediate size "
                        f"{spec.moe_intermediate_size})")
    if problems:
        raise ConfigError(f"tensor_parallel_size {tp} does not divide the model's {', '.join(problems)}; "
                          "choose a tensor_parallel_size that divides them")


def check_max_model_len(max_model_len: int, max_position_embeddings: int) -> None:
    """A context longer than the model's positions cannot be served."""
    if max_model_len > max_position_embeddings:
        raise ConfigError(
            f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
            f"{max_position_embeddings}; lower --max-model-len"
        )


def _moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec's mixture-of-experts fields from an HF config (none for a dense model). Layer i is an MoE layer
    when it is not in mlp_only_layers and (i + 1) is a multiple of decoder_sparse_step, as HF's Qwen3-MoE says."""
    if not cfg.get("num_experts"):
        return {}
    experts = _positive(cfg, "num_experts")
    layers = _positive(cfg, "num_hidden_layers")
    step = _positive(cfg, "decoder_sparse_step", 1)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ModelLoadError(f"config.json field 'mlp_only_layers' must be a list of layer indices, got {dense!r}")
    if cfg.get("shared_expert_intermediate_size"):
        raise ModelLoadError("shared experts (shared_expert_intermediate_size) are not supported")
    top_k = _positive(cfg, "num_experts_per_tok")
    if top_k > experts:
        raise ModelLoadError(f"config.json: num_experts_per_tok {top_k} exceeds num_experts {experts}")
    return dict(num_experts=experts, num_experts_per_tok=top_k,
                moe_intermediate_size=_positive(cfg, "moe_intermediate_size"),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                moe_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0))


_LAYER_TYPES = ("sliding_attention", "full_attention")


def _gpt_oss_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec's fields for gpt-oss: every layer's MLP is experts (of intermediate_size, with biases and the clamped
    SwiGLU), layer_types alternate sliding-window and full attention (HF's default: even layers slide), each head
    has a learned sink, and a `quantization_config` of quant_method mxfp4 means MXFP4 experts."""
    layers = _positive(cfg, "num_hidden_layers")
    experts = _positive(cfg, "num_local_experts")
    top_k = _positive(cfg, "num_experts_per_tok", cfg.get("experts_per_token"))
    if top_k > experts:
        raise ModelLoadError(f"config.json: num_experts_per_tok {top_k} exceeds num_local_experts {experts}")
    types = cfg.get("layer_types") or [_LAYER_TYPES[(i + 1) % 2 == 0] for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        raise ModelLoadError(f"config.json field 'layer_types' must list {layers} of {', '.join(_LAYER_TYPES)}, "
                             f"got {types!r}")
    return dict(num_experts=experts, num_experts_per_tok=top_k,
                moe_intermediate_size=_positive(cfg, "intermediate_size"), moe_layers=tuple(range(layers)),
                moe_bias=True, swiglu=(_number(cfg, "swiglu_alpha", 1.702), _number(cfg, "swiglu_limit", 7.0)),
                expert_quantization=checkpoint_expert_quantization(cfg),
                sliding_window=_positive(cfg, "sliding_window", 128), attention_sinks=True,
                sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _positive(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None:  # absent or null: the field's default, if it has one
        if default is None:
            raise KeyError(key)
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"config.json field {key!r} must be a positive integer, got {value!r}")
    return value


def _number(cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ModelLoadError(f"config.json field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _token_ids(eos: Any) -> tuple[int, ...]:
    ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ModelLoadError(f"config.json field 'eos_token_id' must be a token id or a list of them, got {eos!r}")
    return tuple(ids)

