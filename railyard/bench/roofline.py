"""The performance model of DESIGN.md: the fastest an offline workload can run on one GPU.

floor = prefill FLOPs / peak + sum over decode steps of max(bytes read / HBM bandwidth, FLOPs / peak),
bytes = every weight the step reads (the embedding table is gathered, not read; the LM head is)
plus the KV of every running sequence. Idealised schedule: every prompt prefilled (yielding its
first token), then all sequences decode together, each leaving when its output is complete.
Torch-free: it reads only the model's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

H200_PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this workplace's H200s
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
    dtype_bytes: int = 2

    @classmethod
    def of(cls, spec, dtype_bytes: int = 2) -> "ModelShape":
        """From a ModelSpec (or anything with its field names)."""
        return cls(spec.hidden_size, spec.intermediate_size, spec.num_layers, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.vocab_size, dtype_bytes)

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
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

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

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def offline_roofline(shape: ModelShape, prompt_lens: list[int], output_lens: list[int],
                     peak_tflops: float = H200_PEAK_TFLOPS, hbm_tbs: float = H200_HBM_TBS) -> Roofline:
    peak, bw = peak_tflops * 1e12, hbm_tbs * 1e12
    lm_head = 2.0 * shape.vocab_size * shape.hidden_size
    layers = 2.0 * shape.num_layers * shape.layer_matmul_params
    prefill_flops = sum(layers * n + shape.attention_flops(n, (n + 1) / 2) + lm_head for n in prompt_lens)
    prefill_s = prefill_flops / peak
    weight_bytes = shape.matmul_params * shape.dtype_bytes
    steps = max(output_lens, default=1) - 1  # the first output token comes from the prefill
    decode_s, memory_bound = 0.0, 0
    for j in range(1, steps + 1):
        ctx = [p + j for p, o in zip(prompt_lens, output_lens) if o > j]
        if not ctx:
            break
        kv = sum(ctx)
        flops = (layers + lm_head) * len(ctx) + shape.attention_flops(1, kv / len(ctx)) * len(ctx)
        bytes_ = weight_bytes + kv * shape.kv_bytes_per_token
        t_mem, t_flop = bytes_ / bw, flops / peak
        memory_bound += t_mem >= t_flop
        decode_s += max(t_mem, t_flop)
    return Roofline(prefill_s, decode_s, prefill_s + decode_s, steps, memory_bound, peak_tflops, hbm_tbs)
