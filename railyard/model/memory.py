"""How one GPU's memory divides between weights, one step's activations, reserves and KV-cache blocks.

One formula for both sides: the engine's start-up profile fills it with what it measured, the planner
(`railyard plan`) with what the model description predicts, so the two agree by construction wherever
the prediction is right (tests/model/test_memory.py holds the predictions against the engine's reports).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from railyard.model.spec import ModelSpec, widens_mxfp4

GIB = 2**30
# Device memory outside torch's allocator: the CUDA context and cuBLAS handles (what the engine's start-up
# profile reports on a Hopper GPU with torch 2.11 + CUDA 13).
CUDA_CONTEXT_BYTES = int(0.67 * GIB)
# Float32 logits of a full batch at sampling (4 bytes) plus the decode CUDA graphs' pools, per sequence and
# vocabulary entry, and a fixed part for the graphs' own memory.
_RESERVE_BYTES_PER_LOGIT = 12


def profile_tokens(max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
    """The largest step the engine can schedule: the one its profile runs."""
    return min(max_num_batched_tokens, max_model_len * max_num_seqs)


# Piecewise CUDA graphs cover steps up to this many tokens. Beyond it a step's GPU work outlasts its eager
# launches, which the host issues while the device still runs, and
# padding to a bucket would only add GEMM work: such steps run eagerly.
MAX_PIECEWISE_TOKENS = 2048


def piecewise_tokens(max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
    """The largest step the piecewise CUDA graphs are captured for."""
    return min(profile_tokens(max_num_batched_tokens, max_model_len, max_num_seqs), MAX_PIECEWISE_TOKENS)


def piecewise_graph_bytes(spec: ModelSpec, num_tokens: int) -> int:
    """A prediction of what the piecewise CUDA graphs hold (single GPU): their static buffers (ids and
    positions, q, k, v, attention output, residual, hidden) and one memory pool as large as one piece's
    temporaries at the largest token count (the MLP's gate/up output and SiLU product, or the attention
    side's QKV and rotated q/k, beside the residual stream)."""
    b, t, h = spec.dtype_bytes, num_tokens, spec.hidden_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    static = t * 16 + t * (2 * q + 2 * kv + 2 * h) * b
    pool = max(t * (3 * h + mlp_temporaries(spec)) * b + widened_experts_bytes(spec, t),
               t * (2 * h + (q + 2 * kv) + 2 * (q + kv)) * b)
    return static + pool


def mlp_temporaries(spec: ModelSpec, tp: int = 1) -> int:
    """Elements (of the model dtype) per token of an MLP's temporaries on one rank: a dense MLP's gate/up output and
    SiLU product; an MoE layer's, for each of its top-k experts, those and the expert's down output, and the two
    int32 [slots, experts] tables that sort its slots by expert (kernels/fused_moe.py); whichever kind is larger."""
    dense = 3 * (spec.intermediate_size // tp) if spec.num_dense_layers else 0
    k = spec.num_experts_per_tok
    moe = k * (3 * spec.expert_intermediate(tp) + spec.hidden_size + 8 * spec.num_experts // spec.dtype_bytes) \
        if spec.is_moe else 0
    return max(dense, moe)


def reserve_bytes(max_num_seqs: int, vocab_size: int, enforce_eager: bool) -> int:
    """Memory that the decode CUDA graphs and the sampler's float32 logits take outside the profiled step."""
    return 0 if enforce_eager else max_num_seqs * vocab_size * _RESERVE_BYTES_PER_LOGIT + GIB


# The rank LoRA slots are padded to is a power of two, at least this (the batched-LoRA kernels' rank tile).
MIN_LORA_RANK_TILE = 16


def lora_rank_tile(max_lora_rank: int) -> int:
    """The rank every LoRA slot is padded to: the next power of two, at least MIN_LORA_RANK_TILE."""
    return max(MIN_LORA_RANK_TILE, 1 << (max_lora_rank - 1).bit_length())


def lora_slot_bytes(spec: ModelSpec, max_loras: int, max_lora_rank: int, tp: int = 1) -> int:
    """Device memory of the LoRA adapter slots on one rank, allocated at start whatever the adapters target (as
    vLLM's): per slot and decoder layer, each of the seven projections holds A [rank, in] and B [out, rank] at its
    padded rank, in the model dtype. Column-parallel layers (q, k, v, gate, up) shard B's rows, row-parallel ones
    (o, down) A's columns, as their weights are sharded."""
    if max_loras <= 0:
        return 0
    h, inter = spec.hidden_size, spec.intermediate_size // tp
    q, kv = spec.num_heads // tp * spec.head_dim, spec.kv_heads_per_rank(tp) * spec.head_dim
    column = (h + q) + 2 * (h + kv) + 2 * (h + inter)  # q, k, v, gate, up: A whole, B sharded
    row = (q + h) + (inter + h)  # o, down: A sharded, B whole
    return max_loras * spec.num_layers * lora_rank_tile(max_lora_rank) * (column + row) * spec.dtype_bytes


def widened_experts_bytes(spec: ModelSpec, num_tokens: int, tp: int = 1) -> int:
    """The transient buffer a step of num_tokens widens MXFP4 experts into on one rank (kernels/fused_moe.py: one
    projection at a time, the gate/up one the larger), where its slots reach MXFP4_WIDEN_SLOTS_PER_EXPERT per
    expert; else 0."""
    if spec.expert_quantization != "mxfp4" or not widens_mxfp4(num_tokens * spec.num_experts_per_tok, spec.num_experts):
        return 0
    return spec.num_experts * 2 * spec.expert_intermediate(tp) * spec.hidden_size * spec.dtype_bytes


def activation_bytes(spec: ModelSpec, num_tokens: int, max_num_seqs: int, tp: int = 1) -> int:
    """A prediction of the engine's profiled activation peak for a step of `num_tokens`, on one rank.

    The peak is the largest set of tensors alive at once: in the MLP the gate/up output and its SiLU
    product beside the residual stream; in attention the fused QKV, the rotated q/k and the output;
    at the end the logits of the sampled rows (model dtype and float32). Plus the rotary tables, and MXFP4 experts
    widened for a large step.
    """
    b, t, h = spec.dtype_bytes, num_tokens, spec.hidden_size
    q = spec.num_heads // tp * spec.head_dim
    kv = spec.kv_heads_per_rank(tp) * spec.head_dim
    mlp = t * (2 * h + mlp_temporaries(spec, tp)) * b + widened_experts_bytes(spec, t, tp)
    attention = t * (2 * h + (q + 2 * kv) + 2 * (q + kv) + q) * b
    logits = t * h * b + min(t, max_num_seqs) * spec.vocab_size * (b + 4)
    rotary = 2 * spec.max_position_embeddings * spec.head_dim * 4
    return max(mlp, attention, logits) + rotary


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory: the engine's start-up report (measured), or the planner's prediction of it."""

    total_bytes: int
    utilization: float
    weights_bytes: int
    activation_bytes: int  # peak of the largest step beyond the weights (activations, rotary tables)
    other_bytes: int  # outside this process's torch allocator: CUDA context, other processes
    reserve_bytes: int  # decode CUDA graphs, sampler logits
    block_bytes: int  # one KV-cache block on this GPU
    lora_bytes: int = 0  # LoRA adapter slots (0 where the engine serves none)

    @property
    def kv_cache_bytes(self) -> int:
        """What the utilization share of the memory leaves for KV blocks."""
        used = self.weights_bytes + self.activation_bytes + self.other_bytes + self.reserve_bytes + self.lora_bytes
        return max(0, int(self.total_bytes * self.utilization) - used)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_bytes // self.block_bytes

    def as_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "kv_cache_bytes": self.kv_cache_bytes, "num_blocks": self.num_blocks}

    def describe(self) -> str:
        """The start-up report's line: every share in GiB and the blocks they leave."""
        lora = f"LoRA slots {self.lora_bytes / GIB:.2f} GiB, " if self.lora_bytes else ""
        return (f"weights {self.weights_bytes / GIB:.2f} GiB, {lora}activations {self.activation_bytes / GIB:.2f} GiB, "
                f"others {self.other_bytes / GIB:.2f} GiB, reserve {self.reserve_bytes / GIB:.2f} GiB, "
                f"memory {self.total_bytes / GIB:.1f} GiB x {self.utilization:.2f} -> KV cache "
                f"{self.num_blocks * self.block_bytes / GIB:.2f} GiB ({self.num_blocks} blocks)")
