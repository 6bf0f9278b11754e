"""The Llama-family decoder (Llama, Mistral, Qwen2 with QKV bias, Qwen3 with q/k norm, Qwen3-MoE with experts in
the layers spec.moe_layers names).

One implementation, configured by ModelSpec; fused QKV and gate/up; tensor-parallel layers.
Attention state is passed explicitly (AttentionMetadata), never through globals.
"""

from __future__ import annotations

import functools
import re

import torch
from torch import nn

from railyard.engine.runner.attention.metadata import AttentionMetadata
from railyard.engine.runner.layers.activation import silu_and_mul
from railyard.engine.runner.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from railyard.engine.runner.layers.fp8 import FP8, ScaledAccumulator
from railyard.engine.runner.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from railyard.engine.runner.layers.norm import RMSNorm
from railyard.engine.runner.layers.rotary import RotaryEmbedding
from railyard.engine.runner.layers.parallel import SINGLE, ParallelState
from railyard.engine.runner.models.block_scales import per_channel_except_experts
from railyard.engine.runner.models.gpt_oss import GptOssMLP, gpt_oss_expert_target
from railyard.engine.runner.models.moe_mlp import MoEMLP, expert_target
from railyard.errors import ModelLoadError
from railyard.model.spec import ModelSpec

# Per-layer KV-cache scales as FP8 checkpoints name them (vLLM's Fp8Config and compressed-tensors spellings).
_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:(k|v)_scale|(k|v)_proj\.output_scale|kv_scale)$")


class Attention(nn.Module):
    """Projections around the paged attention backend; the decoder layer calls them in turn (project, attn,
    o_proj) so that the pieces a CUDA graph can hold stay apart from attention."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, backend_cls, ps: ParallelState,
                 layer: int = 0) -> None:
        super().__init__()
        quant = spec.quantization
        self.qkv_proj = QKVParallelLinear(spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads,
                                          spec.attention_bias, ps, quant=quant)
        self.o_proj = RowParallelLinear(spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_proj_bias, ps,
                                        quant=quant)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rotary = rotary
        window = spec.sliding_window if layer in spec.sliding_layers else None
        self.attn = backend_cls(self.num_heads, self.num_kv_heads, self.head_dim, spec.head_dim ** -0.5,
                                sliding_window=window)
        if spec.attention_sinks:  # gpt-oss: one learned logit per head (this rank's heads), read by the backend
            self.sinks = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)
            self.sinks.weight_loader = functools.partial(_load_head_slice, rank=ps.rank)
            self.attn.sinks = self.sinks

    def project(self, positions: torch.Tensor, x: torch.Tensor):
        """Everything before attention: QKV projection, q/k norm, rotary -> q [T, H, D], k, v [T, Hk, D]."""
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return q, k, v


def _load_head_slice(param: nn.Parameter, loaded: torch.Tensor, shard=None, *, rank: int) -> None:
    """A per-head vector: this rank's heads of it."""
    n = param.shape[0]
    param.data.copy_(loaded.narrow(0, rank * n, n))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ps: ParallelState) -> None:
        super().__init__()
        inter, quant = spec.intermediate_size, spec.quantization
        self.gate_up_proj = MergedColumnParallelLinear(spec.hidden_size, [inter, inter], False, ps, quant=quant)
        self.down_proj = RowParallelLinear(inter, spec.hidden_size, False, ps, quant=quant)

    def forward(self, x: torch.Tensor, defer_scales: bool = False) -> torch.Tensor | ScaledAccumulator:
        """defer_scales: as RowParallelLinear's (the caller hands the output to an RMSNorm only)."""
        gate_up, quantize = self.gate_up_proj, self.down_proj.takes_quantized_input
        if gate_up.lora is not None and not quantize and gate_up.lora.fuses_silu_and_mul(x):
            # the adapters' sums join the activation's pass over gate/up instead of a read and write of their own
            h = gate_up.lora.silu_and_mul(x, gate_up.base_forward(x))
        else:
            h = silu_and_mul(gate_up(x), quantize_output=quantize)
        return self.down_proj(h, defer_scales=defer_scales)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, backend_cls, ps: ParallelState,
                 layer: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(spec, rotary, backend_cls, ps, layer)
        moe = spec.is_moe_layer(layer)
        self.mlp = (GptOssMLP if spec.moe_bias else MoEMLP)(spec, ps) if moe else MLP(spec, ps)
        # Each feeds one linear layer only (qkv, gate_up): with FP8 weights, the norm quantizes for it (GPU). Not
        # before experts: their router reads the activation unquantized.
        fp8 = spec.quantization == "fp8"
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, quantize_output=fp8)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, quantize_output=fp8 and not moe)

    def adapters_attached(self) -> None:
        """LoRA slots now sit on some of this layer's linear layers. An adapter reads its layer's input as it is, so
        a norm stops quantizing for a projection that holds slots (the projection quantizes its own copy for the
        FP8 GEMM); the MLP asks its down projection each pass."""
        if not self.self_attn.qkv_proj.takes_quantized_input:
            self.input_layernorm.quantize_output = False
        if isinstance(self.mlp, MLP) and not self.mlp.gate_up_proj.takes_quantized_input:
            self.post_attention_layernorm.quantize_output = False

    def pre_attention(self, positions, x, residual):
        """Input norm (adding the residual first, except in layer 0) and the attention's projections:
        (q, k, v, residual). Together with post_attention, all of the layer that a CUDA graph can hold."""
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        return (*self.self_attn.project(positions, x), residual)

    def post_attention(self, attn_out, residual):
        """Output projection, residual add + norm and the MLP: (x, residual) for the next layer. Both projections'
        outputs go only to an RMSNorm (x to the next layer's input norm or the final norm, which every caller
        runs next), so with FP8 weights they may be ScaledAccumulators whose scales the norm applies."""
        x = self.self_attn.o_proj(attn_out.reshape(-1, self.self_attn.q_size), defer_scales=True)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x, defer_scales=True), residual

    def forward(self, positions, x, residual, kv_cache, meta, num_tokens: int | None = None,
                out: torch.Tensor | None = None):
        """-> (x, residual) for the next layer; x as post_attention returns it (for an RMSNorm only).
        num_tokens (given with out, where there is padding): only the first rows are the step's tokens: attention
        runs on those rows into out[:num_tokens], whose other rows the caller keeps zero (DecoderModel.forward)."""
        q, k, v, residual = self.pre_attention(positions, x, residual)
        if num_tokens is None:
            return self.post_attention(self.self_attn.attn.forward(q, k, v, kv_cache, meta), residual)
        n = num_tokens
        self.self_attn.attn.forward(q[:n], k[:n], v[:n], kv_cache, meta, out=out[:n])
        return self.post_attention(out, residual)


class DecoderModel(nn.Module):
    def __init__(self, spec: ModelSpec, backend_cls, ps: ParallelState) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, ps)
        # One rotary table shared by all layers (not a parameter).
        rotary = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings, spec.rope_theta, spec.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(spec, rotary, backend_cls, ps, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.rotary = rotary
        self.lora_batch = None  # where the engine serves LoRA adapters: the step's tokens by adapter slot

    def forward(self, input_ids, positions, kv_caches, meta, num_tokens: int | None = None):
        """Hidden states of every row. num_tokens: only the first rows are the step's tokens, the rest padding
        (row_buckets.py): as in the piecewise graphs, attention reads and writes the real rows only, and every
        other operation, being row-wise, leaves them as they would be unpadded."""
        if self.lora_batch is not None:
            self.lora_batch.prepare(input_ids.shape[0])
        x, residual = self.embed_tokens(input_ids), None
        padded = {}
        if num_tokens is not None and num_tokens < input_ids.shape[0]:
            attn = self.layers[0].self_attn  # every layer's attention output in turn; its padding rows stay zero
            out = x.new_zeros(input_ids.shape[0], attn.num_heads, attn.head_dim)
            padded = dict(num_tokens=num_tokens, out=out)
        for layer, cache in zip(self.layers, kv_caches):
            x, residual = layer(positions, x, residual, cache, meta, **padded)
        x, _ = self.norm(x, residual)
        return x

    # The forward pass split at each layer's attention into num_layers + 1 pieces (piecewise CUDA graphs):
    # piece 0 embeds and runs layer 0 up to its attention; piece i runs layer i-1 after its attention and
    # layer i up to its attention; piece num_layers runs the last layer after attention and the final norm.
    # Each piece is row-wise (token by token), so padded rows never change real ones.
    def first_piece(self, input_ids, positions):
        """-> (q, k, v, residual) of layer 0."""
        if self.lora_batch is not None:
            self.lora_batch.prepare(input_ids.shape[0])
        return self.layers[0].pre_attention(positions, self.embed_tokens(input_ids), None)

    def middle_piece(self, i: int, positions, attn_out, residual):
        """Layer i-1 after attention (its output attn_out), layer i up to attention -> (q, k, v, residual)."""
        x, residual = self.layers[i - 1].post_attention(attn_out, residual)
        return self.layers[i].pre_attention(positions, x, residual)

    def last_piece(self, attn_out, residual):
        """The last layer after attention and the final norm -> hidden states."""
        x, residual = self.layers[-1].post_attention(attn_out, residual)
        x, _ = self.norm(x, residual)
        return x


class CausalLM(nn.Module):
    """Decoder plus LM head; `load_weights` takes HF tensor names shard by shard.

    spec.quantization "fp8": the decoder's linear layers hold FP8 weights; the embedding and LM head stay in the
    model dtype (the LM head's logits feed sampling directly, and it is one GEMM of many).
    """

    # HF checkpoint name fragment -> (our fused parameter fragment, shard id)
    _FUSED = (
        ("q_proj", "qkv_proj", "q"), ("k_proj", "qkv_proj", "k"), ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1),
    )

    def __init__(self, spec: ModelSpec, backend_cls, ps: ParallelState = SINGLE) -> None:
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec, backend_cls, ps)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, ps)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches, meta, num_tokens: int | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, num_tokens)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def load_weights(self, weights) -> set[str]:
        """Copy (name, tensor) pairs in; returns the parameter names that were filled."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        if self.spec.block_scaled_checkpoint:
            weights = per_channel_except_experts(weights)
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if self.spec.tie_word_embeddings and name == "lm_head.weight":
                continue
            kv_scale = _KV_SCALE.search(name)
            if kv_scale:
                self._set_kv_scale(int(kv_scale.group(1)), kv_scale.group(2) or kv_scale.group(3), tensor)
                continue
            target, shard = expert_target(name) or gpt_oss_expert_target(name) or (name, None)
            for hf, ours, shard_id in self._FUSED if shard is None else ():
                if f".{hf}." in name:
                    target, shard = name.replace(f".{hf}.", f".{ours}."), shard_id
                    break
            param = params.get(target)
            if param is None:
                continue  # unused checkpoint tensors (e.g. extra heads) are ignored
            loader = getattr(param, "weight_loader", None)
            if tensor.dtype != param.dtype and tensor.device != param.device:
                tensor = tensor.to(param.device)  # a host tensor (the mapped reader's): convert or quantize it there
            if param.dtype == FP8:
                if tensor.dtype != FP8:  # quantized as it loads: its loader fills the scale too
                    loaded.add(target.removesuffix("weight") + "weight_scale")
            elif tensor.dtype == FP8:
                raise ModelLoadError(f"{name} is float8 but this model's layers are not (config.json declares no "
                                     "FP8 quantization_config for them)")
            elif tensor.dtype != param.dtype:  # (a no-op .to() is still a torch call: one more GIL round trip)
                tensor = tensor.to(param.dtype)
            if loader is None:
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(target)
        return loaded

    def _set_kv_scale(self, layer: int, which: str | None, tensor: torch.Tensor) -> None:
        """A checkpoint's KV-cache scale for one layer (both K and V for the older single `kv_scale`).

        The cache keeps one scale per layer for K and one for V; a checkpoint with finer (per-head) scales
        gets their maximum, which can only make values smaller, never saturate them."""
        if layer >= len(self.model.layers):
            return
        value = float(tensor.float().abs().max())
        if not value > 0.0:
            raise ModelLoadError(f"layer {layer}: KV-cache scale must be positive, got {value}")
        attn = self.model.layers[layer].self_attn.attn
        if which in (None, "k"):
            attn.k_scale = value
        if which in (None, "v"):
            attn.v_scale = value
