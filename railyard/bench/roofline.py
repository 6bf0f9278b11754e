"""The performance model of DESIGN.md: the fastest an offline workload can run on one GPU.

floor = prefill FLOPs / peak + sum over decode steps of max(bytes read / HBM bandwidth, FLOPs / peak),
bytes = every weight the step reads (the embedding table is gathered, not read; the LM head is)
plus the KV of every running sequence. Idealised schedule: every prompt prefilled (yielding its
first token), then all sequences decode together, each leaving when its output is complete.
Torch-free: it reads only the model's shape.

Dtype-aware: with FP8 weights the decoder's linear layers read 1 byte per weight and multiply at the
FP8 rate (the LM head stays in the model dtype at the bf16 rate, as does attention); an FP8 KV cache
reads 1 byte per element.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

H200_PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this workplace's H200s
# FP8 dense matmul: twice the bf16 rate (the datasheet's ratio, 1979 vs 989 TFLOP/s) until measured here;
# scripts/gpu/fp8.sh measures torch._scaled_mm and passes its rate to `bench throughput --fp8-peak-tflops`.
H200_FP8_PEAK_TFLOPS = 2 * H200_PEAK_TFLOPS
H200_HBM_TBS = 4.3  # device-to-device copy, bytes read + written
# Devices whose ceilings were measured here, by a part of their name: (TFLOP/s, TB/s).
KNOWN_PEAKS = {"H200": (H200_PEAK_TFLOPS, H200_HBM_TBS)}


def device_peaks(device_name: str | None, peak_tflops: float | None = None,
                 hbm_tbs: float | None = None) -> tuple[float, float] | None:
    """The ceilings for a roofline: the ones given, else the device's measured ones; None when neither
    (a floor against another device's figures would be a wrong percentage)."""
    known = next((peaks for part, peaks in KNOWN_PEAKS.items() if device_name and part in device_name), None)
    if peak_tflops is not None and hbm_tbs is not None:
        return peak_tflops, hbm_tbs
    if known is None:
        return None
    return peak_tflops or known[0], hbm_tbs or known[1]


@dataclass(frozen=True)
class ModelShape:
    """What the model costs per token: weights touched, FLOPs, KV bytes."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2  # the model dtype: embedding, LM head, activations
    linear_weight_bytes: int | None = None  # the decoder's linear weights (1: FP8); None: dtype_bytes
    kv_dtype_bytes: int | None = None  # one KV-cache element (1: FP8); None: dtype_bytes

    @classmethod
    def of(cls, spec, dtype_bytes: int = 2, linear_weight_bytes: int | None = None,
           kv_dtype_bytes: int | None = None) -> "ModelShape":
        """From a ModelSpec (or anything with its field names)."""
        return cls(spec.hidden_size, spec.intermediate_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.vocab_size, dtype_bytes, linear_weight_bytes, kv_dtype_bytes)

    @property
    def fp8_linear(self) -> bool:
        return self.linear_weight_bytes == 1

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads: the decoder's linear layers and the LM head."""
        layers = self.num_layers * self.layer_matmul_params * (self.linear_weight_bytes or self.dtype_bytes)
        return layers + self.vocab_size * self.hidden_size * self.dtype_bytes

    @property
    def layer_matmul_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        return h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h + 3 * h * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: all layers' projections and the LM head (not the embedding gather)."""
        return self.num_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)

    def attention_flops(self, query_positions: int, keys: int) -> float:
        """QK^T and PV for `query_positions` queries that each see `keys` keys on average."""
        return 4.0 * query_positions * keys * self.head_dim * self.num_heads * self.num_layers


@dataclass
class Roofline:
    prefill_s: float
    decode_s: float
    total_s: float
    decode_steps: int
    decode_memory_bound_steps: int
    peak_tflops: float
    hbm_tbs: float
    fp8_peak_tflops: float | None = None  # the linear layers' rate, when their weights are FP8

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def offline_roofline(shape: ModelShape, prompt_lens: list[int], output_lens: list[int],
                     peak_tflops: float = H200_PEAK_TFLOPS, hbm_tbs: float = H200_HBM_TBS,
                     fp8_peak_tflops: float = H200_FP8_PEAK_TFLOPS) -> Roofline:
    """fp8_peak_tflops: the rate of the decoder's linear layers when their weights are FP8 (shape.fp8_linear)."""
    peak, bw = peak_tflops * 1e12, hbm_tbs * 1e12
    layer_peak = fp8_peak_tflops * 1e12 if shape.fp8_linear else peak
    lm_head = 2.0 * shape.vocab_size * shape.hidden_size
    layers = 2.0 * shape.num_layers * shape.layer_matmul_params
    # Seconds of compute per token at each rate: linear layers, LM head (one row), attention (per query-key pair).
    layer_s, head_s = layers / layer_peak, lm_head / peak
    prefill_s = sum(layer_s * n + (shape.attention_flops(n, (n + 1) / 2)) / peak + head_s for n in prompt_lens)
    weight_bytes = shape.weight_bytes
    steps = max(output_lens, default=1) - 1  # the first output token comes from the prefill
    decode_s, memory_bound = 0.0, 0
    for j in range(1, steps + 1):
        ctx = [p + j for p, o in zip(prompt_lens, output_lens) if o > j]
        if not ctx:
            break
        kv = sum(ctx)
        t_flop = (layer_s + head_s) * len(ctx) + shape.attention_flops(1, kv / len(ctx)) * len(ctx) / peak
        bytes_ = weight_bytes + kv * shape.kv_bytes_per_token
        t_mem = bytes_ / bw
        memory_bound += t_mem >= t_flop
        decode_s += max(t_mem, t_flop)
    return Roofline(prefill_s, decode_s, prefill_s + decode_s, steps, memory_bound, peak_tflops, hbm_tbs,
                    fp8_peak_tflops if shape.fp8_linear else None)
