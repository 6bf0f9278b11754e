"""The performance model of docs/architecture.md: the fastest an offline workload can run on one GPU.

floor = prefill FLOPs / peak + sum over decode steps of max(bytes read / HBM bandwidth, FLOPs / peak),
bytes = every weight the step reads (the embedding table is gathered, not read; the LM head is)
plus the KV of every running sequence. Idealised schedule: every prompt prefilled (yielding its
first token), then all sequences decode together, each leaving when its output is complete.
A mixture of experts multiplies each token by its active parameters only (attention, dense MLPs, its top-k experts,
the routers), and a decode step of B tokens reads, per MoE layer, the experts those tokens route to: the expected
number of distinct experts that B tokens hit when each picks its top-k uniformly at random, E * (1 - (1 - k/E)^B)
(ModelSpec.expected_experts_hit; all E once B is large, k experts at B = 1). Real routing is less even, so a real
step touches somewhat fewer experts than uniform routing would: a floor on that count, not a bound.
Torch-free: everything it counts comes from the model description (railyard.model.spec.ModelSpec),
weights and KV at the precision the run stores them: with FP8 weights the decoder's linear layers read
1 byte per weight and multiply at the FP8 rate (the LM head stays in the model dtype at the bf16 rate,
as does attention); an FP8 KV cache reads 1 byte per element.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from railyard.model.spec import ModelSpec

H200_PEAK_TFLOPS = 790.0  # bf16 dense matmul measured on this workplace's H200s
# FP8 dense matmul: twice the bf16 rate (the datasheet's ratio, 1979 vs 989 TFLOP/s) until measured here;
# scripts/bench/fp8.sh passes the measured _scaled_mm rate (fp8_gemm.py's sweep) as
# `bench throughput --fp8-peak-tflops`.
H200_FP8_PEAK_TFLOPS = 2 * H200_PEAK_TFLOPS
H200_HBM_TBS = 4.3  # device-to-device copy, bytes read + written
# The SXM H100 (80 GB of HBM3), measured the same way on this workplace's H100s.
H100_PEAK_TFLOPS, H100_HBM_TBS = 798.0, 3.0
# Devices whose ceilings were measured here, by a part of their name: (TFLOP/s, TB/s).
KNOWN_PEAKS = {"H200": (H200_PEAK_TFLOPS, H200_HBM_TBS), "H100 80GB HBM3": (H100_PEAK_TFLOPS, H100_HBM_TBS)}


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
    fp8_peak_tflops: float | None = None  # the linear layers' rate, when their weights are FP8

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def offline_roofline(spec: ModelSpec, prompt_lens: list[int], output_lens: list[int],
                     peak_tflops: float = H200_PEAK_TFLOPS, hbm_tbs: float = H200_HBM_TBS,
                     fp8_peak_tflops: float = H200_FP8_PEAK_TFLOPS) -> Roofline:
    """The roofline floor for these prompts and outputs on a GPU of the given matmul peaks and HBM bandwidth.

    peak_tflops: the model dtype's rate (LM head, attention, unquantized projections); fp8_peak_tflops: the
    decoder's linear layers' rate when they multiply in FP8 (spec.matmul_precision "fp8")."""
    fp8 = spec.matmul_precision == "fp8"
    peak, bw = peak_tflops * 1e12, hbm_tbs * 1e12
    layer_peak = fp8_peak_tflops * 1e12 if fp8 else peak
    lm_head = 2.0 * spec.vocab_size * spec.hidden_size
    layers = 2.0 * spec.active_linear_params
    # Seconds of compute per token at each rate: linear layers, LM head (one row), attention (per query-key pair).
    layer_s, head_s = layers / layer_peak, lm_head / peak
    prefill_s = sum(layer_s * n + spec.prefill_attention_flops(n) / peak + head_s for n in prompt_lens)
    steps = max(output_lens, default=1) - 1  # the first output token comes from the prefill
    decode_s, memory_bound = 0.0, 0
    for j in range(1, steps + 1):
        ctx = [p + j for p, o in zip(prompt_lens, output_lens) if o > j]
        if not ctx:
            break
        # Attention per sequence: its whole context in full-attention layers, the window's in sliding ones.
        t_flop = (layer_s + head_s) * len(ctx) + sum(map(spec.decode_attention_flops, ctx)) / peak
        t_mem = (spec.step_weight_bytes(len(ctx)) + sum(map(spec.kv_bytes_read, ctx))) / bw
        memory_bound += t_mem >= t_flop
        decode_s += max(t_mem, t_flop)
    return Roofline(prefill_s, decode_s, prefill_s + decode_s, steps, memory_bound, peak_tflops, hbm_tbs,
                    fp8_peak_tflops if fp8 else None)
