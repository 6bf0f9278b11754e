"""The performance model of DESIGN.md: the fastest an offline workload can run on one GPU.

floor = prefill FLOPs / peak + sum over decode steps of max(bytes read / HBM bandwidth, FLOPs / peak),
bytes = every weight the step reads (the embedding table is gathered, not read; the LM head is)
plus the KV of every running sequence. Idealised schedule: every prompt prefilled (yielding its
first token), then all sequences decode together, each leaving when its output is complete.
Torch-free: everything it counts comes from the model description (railyard.model.spec.ModelSpec),
weights and KV at the precision the run stores them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from railyard.model.spec import ModelSpec

H200_PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this workplace's H200s
H200_HBM_TBS = 4.3  # device-to-device copy, bytes read + written
# Matmul peaks by the precision the projections run in (ModelSpec.matmul_precision); FP8 weights add theirs.
# A precision without a measured figure falls back to bf16's.
H200_PEAK_TFLOPS_BY_PRECISION = {"bfloat16": H200_PEAK_TFLOPS}


def h200_peak_tflops(spec: ModelSpec) -> float:
    """The H200 matmul peak for this model at the precision it runs in."""
    return H200_PEAK_TFLOPS_BY_PRECISION.get(spec.matmul_precision, H200_PEAK_TFLOPS)


@dataclass
class Roofline:
    """The floor of one offline workload, split into its prefill and decode parts."""

    prefill_s: float
    decode_s: float
    total_s: float
    decode_steps: int
    decode_memory_bound_steps: int
    peak_tflops: float
    hbm_tbs: float

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def offline_roofline(spec: ModelSpec, prompt_lens: list[int], output_lens: list[int],
                     peak_tflops: float = H200_PEAK_TFLOPS, hbm_tbs: float = H200_HBM_TBS) -> Roofline:
    """DESIGN.md's floor for these prompts and outputs on a GPU of the given matmul peak and HBM bandwidth."""
    peak, bw = peak_tflops * 1e12, hbm_tbs * 1e12
    lm_head = 2.0 * spec.vocab_size * spec.hidden_size
    layers = 2.0 * spec.num_layers * spec.layer_linear_params()
    prefill_flops = sum(layers * n + spec.attention_flops(n, (n + 1) / 2) + lm_head for n in prompt_lens)
    prefill_s = prefill_flops / peak
    weight_bytes = spec.matmul_weight_bytes
    steps = max(output_lens, default=1) - 1  # the first output token comes from the prefill
    decode_s, memory_bound = 0.0, 0
    for j in range(1, steps + 1):
        ctx = [p + j for p, o in zip(prompt_lens, output_lens) if o > j]
        if not ctx:
            break
        kv = sum(ctx)
        flops = (layers + lm_head) * len(ctx) + spec.attention_flops(1, kv / len(ctx)) * len(ctx)
        bytes_ = weight_bytes + kv * spec.kv_bytes_per_token()
        t_mem, t_flop = bytes_ / bw, flops / peak
        memory_bound += t_mem >= t_flop
        decode_s += max(t_mem, t_flop)
    return Roofline(prefill_s, decode_s, prefill_s + decode_s, steps, memory_bound, peak_tflops, hbm_tbs)
