"""FP8 linear layers: e4m3 numbers with per-channel weight and per-token activation scales, the GEMM on
FP8 tensor cores or through the dequantizing reference, and tensor-parallel shards of both.

Oracles: torch's own float8_e4m3fn conversion (round to nearest even), a float32 matmul, and the
unsharded layer (a rank's shard must be a slice of it, scales included).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import railyard.engine.runner.layers.fp8 as fp8_layer
from railyard.engine.runner.layers.fp8 import (FP8, FP8_MAX, INV_FP8_MAX, QuantizedActivation, ScaledAccumulator,
                                        apply_scales_ref, dequantized_linear, fp8_linear, quantize_per_token,
                                        quantize_per_token_ref, quantize_rows, rowwise_underfills, scaled_mm,
                                        scaled_mm_supported, tensor_core_gemm, unscaled_mm)
from railyard.engine.runner.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                                           RowParallelLinear)
from railyard.engine.runner.layers.norm import RMSNorm
from railyard.engine.runner.layers.parallel import ParallelState


def _randn(*shape, seed=0, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_weight_rows_quantize_to_e4m3_with_amax_over_448_scales():
    w = _randn(6, 40) * torch.logspace(-3, 2, 6)[:, None]  # rows five decades apart: each gets its own scale
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (6,)
    torch.testing.assert_close(scale, w.abs().amax(1) / FP8_MAX)
    assert torch.equal(q.view(torch.uint8), (w * (1 / scale[:, None])).to(FP8).view(torch.uint8))  # torch's rounding
    assert torch.equal(q.float().abs().amax(1), torch.full((6,), FP8_MAX))  # each row's largest lands on 448
    # e4m3 keeps 3 mantissa bits: every normal value is within 2^-4 of itself after the round trip
    assert ((q.float() * scale[:, None] - w).abs() <= w.abs() * 2 ** -4 + scale[:, None] * 2 ** -10).all()


def test_scales_are_amax_times_the_float32_reciprocal_of_448_on_every_device():
    """One recipe for torch on the CPU, torch on CUDA and the Triton kernels: `amax / 448.0` is a rounded
    division on the CPU and in Triton but a multiplication by float32(1/448) in torch on CUDA, which differ in
    about half of all rows; the multiplication is the same everywhere."""
    x = _randn(64, 96, seed=21).to(torch.bfloat16)
    _, scale = quantize_per_token_ref(x)
    amax = x.float().abs().amax(1)
    assert torch.equal(scale[:, 0], amax * torch.tensor(1 / 448, dtype=torch.float32))
    assert INV_FP8_MAX == torch.tensor(1 / 448, dtype=torch.float32).item()
    assert not torch.equal(scale[:, 0], amax / FP8_MAX)  # the division would have given other scales here


def test_per_token_scales_are_per_row_and_a_zero_row_stays_zero():
    x = _randn(5, 32, seed=1)
    x[2] = 0.0  # a padded row of a CUDA-graph batch
    q, scale = quantize_per_token_ref(x)
    assert scale.shape == (5, 1)
    assert torch.equal(q[2].float(), torch.zeros(32)) and torch.isfinite(q.float()).all()
    torch.testing.assert_close(scale[[0, 1, 3, 4], 0], x[[0, 1, 3, 4]].abs().amax(1) / FP8_MAX)


def test_fp8_linear_stays_within_two_roundings_of_the_float_matmul():
    x, w = _randn(64, 256, seed=2), _randn(96, 256, seed=3, scale=0.05)
    q, scale = quantize_rows(w)
    got, want = fp8_linear(x, q, scale), F.linear(x, w)
    # Each operand carries e4m3's rounding (~2.5% RMS for Gaussian data), the product ~3.6% (measured); a wrong
    # scale or channel order would be off by 100% or more.
    assert ((got - want).norm() / want.norm()).item() < 0.05


def _cpu_scaled_mm_takes_row_scales() -> bool:
    """torch 2.13's CPU _scaled_mm takes row-wise scales (and a bias); 2.11's, the GPU machine's, per-tensor ones only."""
    a = torch.zeros(16, 16, dtype=FP8)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), bias=torch.zeros(16),
                         out_dtype=torch.float32)
    except RuntimeError:
        return False
    return True


def _small_gemm_operands():
    """e4m3 operands with their scales and a bias (33 tokens, 64 -> 48), and the dequantizing reference's result."""
    x, w, b = _randn(33, 64, seed=4), _randn(48, 64, seed=5), _randn(48, seed=6)
    xq, xs = quantize_per_token_ref(x)
    q, scale = quantize_rows(w)
    return (xq, xs, q, scale, b), dequantized_linear(xq, xs, q, scale, b, torch.float32)


@pytest.mark.skipif(not _cpu_scaled_mm_takes_row_scales(),
                    reason="this torch's CPU _scaled_mm has no row-wise scales (the GPU test below checks the call)")
def test_scaled_mm_arguments_give_what_the_dequantizing_reference_gives():
    """The GEMM call the GPU makes, checked where torch implements it on the CPU (float32 output: exact)."""
    operands, want = _small_gemm_operands()
    torch.testing.assert_close(scaled_mm(*operands, torch.float32), want, atol=1e-4, rtol=1e-5)


def test_unscaled_gemm_then_the_scales_gives_what_the_dequantizing_reference_gives():
    """The cuBLASLt path's call, where torch implements it on the CPU (scalar scales, float32 out; 2.11 and 2.13):
    the unit-scale GEMM sums e4m3 products exactly in float32, and the scales and bias come after."""
    operands, want = _small_gemm_operands()
    torch.testing.assert_close(unscaled_mm(*operands, torch.float32), want, atol=1e-4, rtol=1e-5)


def test_the_scales_multiply_each_row_by_its_token_and_each_column_by_its_channel():
    acc = _randn(5, 7, seed=10) * 1000  # unscaled sums of e4m3 products are large
    xs, ws, b = _randn(5, 1, seed=11).abs(), _randn(7, seed=12).abs(), _randn(7, seed=13)
    got = apply_scales_ref(acc, xs, ws, b.to(torch.bfloat16), torch.bfloat16)
    want = acc.double() * xs.double() * ws.double()[None, :] + b.to(torch.bfloat16).double()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2.0 ** -8, atol=0)  # bf16's rounding, nothing more
    torch.testing.assert_close(apply_scales_ref(acc, xs, ws, None, torch.float32).double(),
                               acc.double() * xs.double() * ws.double()[None, :], rtol=1e-6, atol=0)


@pytest.mark.parametrize("option, rows, n, gemm", [
    ("auto", 256, 3584, "cublaslt-fast"),  # the 7B's o and down at a 256-row decode step: 2 x 28 tiles, 132 SMs
    ("auto", 1, 4608, "cublaslt-fast"),  # qkv at one row: 36 tiles
    ("auto", 256, 37888, "rowwise-fast"),  # gate_up: 2 x 296 tiles fill the GPU
    ("auto", 257, 3584, "rowwise-fast"),  # above CUBLASLT_MAX_TOKENS, however few its tiles
    ("auto", 16384, 3584, "rowwise-fast"),
    ("rowwise", 1, 3584, "rowwise"), ("rowwise-fast", 16384, 3584, "rowwise-fast"),
    ("cublaslt", 16384, 37888, "cublaslt"), ("cublaslt-fast", 16384, 37888, "cublaslt-fast"),
    ("triton", 256, 3584, "triton"),
])
def test_auto_takes_cublaslt_for_decode_sized_gemms_the_rowwise_kernel_would_not_spread_over_the_gpu(
        option, rows, n, gemm, monkeypatch):
    """The H200 sweep (fp8-gemm.sh): the row-wise kernel's 128 x 128 tiles, K never split, left a 256-row down
    projection at 47.5 us on 56 of 132 SMs, where cuBLASLt's unscaled GEMM and the scales pass took 35.4."""
    monkeypatch.setattr(fp8_layer, "CUBLASLT_MAX_TOKENS", 256)
    assert tensor_core_gemm(option, rows, n, sms=132) == gemm


def test_auto_takes_the_rowwise_kernel_when_the_sm_count_is_unknown():
    assert tensor_core_gemm("auto", 1, 3584) == "rowwise-fast"


def test_the_rowwise_grid_counts_whole_tiles_against_the_sms():
    assert rowwise_underfills(256, 3584, 132)  # 2 x 28 = 56
    assert not rowwise_underfills(512, 4608, 132)  # 4 x 36 = 144
    assert not rowwise_underfills(129, 8448, 132)  # 2 x 66 = 132: one full wave
    assert rowwise_underfills(128, 8448, 132)  # 1 x 66


GEMMS = ["rowwise", "rowwise-fast", "cublaslt", "cublaslt-fast", "triton"]
needs_fp8_tensor_cores = pytest.mark.skipif(
    not (torch.cuda.is_available() and scaled_mm_supported(torch.device("cuda"), torch.bfloat16)),
    reason="needs FP8 tensor cores (compute capability 8.9+)")


def assert_within_the_accumulation_bound(got, want, xq, xs, q, scale):
    """got within bf16's rounding of want (2^-8 |y|) plus 2^-10 S, S = sum_k |x_k w_k| (the tensor-core bound the
    tensor-core test below derives)."""
    magnitude = (xq.float().abs() * xs) @ (q.float().abs() * scale[:, None]).t()
    excess = (got.float() - want).abs() - 2.0 ** -8 * want.abs()
    assert (excess <= 2.0 ** -10 * magnitude).all(), f"worst excess {(excess / magnitude).max().item():.2e} of S"


@needs_fp8_tensor_cores
def test_the_unscaled_gemm_into_bf16_stays_within_two_bf16_roundings_on_the_gpu():
    """unscaled_mm's acc_dtype bfloat16 (a sweep variant): the unscaled sums round to bf16 before the scales, then
    the result again; two roundings of 2^-9 each, plus the accumulation bound of the tensor-core test below."""
    dev = torch.device("cuda")
    x = _randn(300, 3584, seed=7).to(dev, torch.bfloat16)
    q, scale = quantize_rows(_randn(4608, 3584, seed=8, scale=0.02).to(dev))
    xq, xs = quantize_per_token(x)
    got = unscaled_mm(xq, xs, q, scale, None, torch.bfloat16, torch.bfloat16)
    want = dequantized_linear(xq, xs, q, scale, None, torch.float32)
    assert_within_the_accumulation_bound(got, want, xq, xs, q, scale)


@needs_fp8_tensor_cores
@pytest.mark.parametrize("fp8_gemm", GEMMS)
def test_tensor_core_fp8_linear_matches_the_reference_path_on_the_gpu(fp8_gemm):
    """The same e4m3 numbers through torch._scaled_mm and through the dequantizing float32 reference differ by two
    roundings: bf16's of the output (at most 2^-8 of |y|) and the tensor cores' accumulation, which Hopper runs
    at reduced precision inside each MMA (an FP22 accumulator, 13 fraction bits; DeepSeek-V3 report, 3.3.2).
    That error scales with S = sum_k |x_k w_k|, not with |y| (which cancellation makes smaller): modelled on the
    CPU over this test's data (scripts/dev/fp8_gemm_replay.py), truncating to 14 significant bits over all of K
    without promotion to float32, it stays under 2.9e-4 S (8e-6 S with promotion every 128, as cuBLAS and
    CUTLASS do without fast accumulation); 2^-10 S allows over three times the former, so rowwise-fast (fast
    accumulation, the unpromoted case) is held to the same bound. A wrong layout or scale
    errs by |y| itself (~1.5 here; 2^-10 S is ~0.045). The first H200 run's 656 misses of a plain atol/rtol were
    not the GEMM: the Triton kernel and torch then quantized x with scales one float32 step apart (the same
    script replays that: 656 misses, worst 0.0757)."""
    dev = torch.device("cuda")
    x = _randn(300, 3584, seed=7).to(dev, torch.bfloat16)  # a 7B hidden size; M not a multiple of 16
    w, b = _randn(4608, 3584, seed=8, scale=0.02).to(dev), _randn(4608, seed=9).to(dev, torch.bfloat16)
    q, scale = quantize_rows(w)
    got = fp8_linear(x, q, scale, b, fp8_gemm)
    xq, xs = quantize_per_token(x)  # the quantization fp8_linear ran: this checks the GEMM alone
    want = dequantized_linear(xq, xs, q, scale, b.float(), torch.float32)
    assert got.dtype == torch.bfloat16 and got.shape == (300, 4608)
    assert_within_the_accumulation_bound(got, want, xq, xs, q, scale)


@needs_fp8_tensor_cores
@pytest.mark.parametrize("fp8_gemm", GEMMS)
def test_each_tensor_core_gemm_replays_from_a_cuda_graph_as_it_ran_eagerly(fp8_gemm):
    """The engine captures decode steps after eager warm-up runs (cuda_graphs.py): what a GEMM path makes at its
    first call (cuBLASLt's unit scale, Triton's compiled and autotuned kernels) must then serve the replays."""
    dev = torch.device("cuda")
    x = _randn(256, 512, seed=20).to(dev, torch.bfloat16)
    q, scale = quantize_rows(_randn(384, 512, seed=21, scale=0.02).to(dev))
    b = _randn(384, seed=22).to(dev, torch.bfloat16)
    eager = fp8_linear(x, q, scale, b, fp8_gemm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fp8_linear(x, q, scale, b, fp8_gemm)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def _layers(kind: str, ps: ParallelState):
    """One layer of each parallel kind, FP8, with the tiny model's shapes (64 hidden, 4 heads of 16, 2 KV)."""
    if kind == "column":
        return ColumnParallelLinear(64, 128, True, ps, quant="fp8")
    if kind == "merged":
        return MergedColumnParallelLinear(64, [128, 128], False, ps, quant="fp8")
    if kind == "qkv":
        return QKVParallelLinear(64, 16, 4, 2, True, ps, quant="fp8")
    return RowParallelLinear(128, 64, False, ps, quant="fp8")


def _checkpoint(kind: str) -> list[tuple[torch.Tensor, object]]:
    """(tensor, shard id) pairs as the checkpoint holds them for each kind."""
    if kind == "column":
        return [(_randn(128, 64, seed=10), None)]
    if kind == "merged":
        return [(_randn(128, 64, seed=11), 0), (_randn(128, 64, seed=12) * 3, 1)]
    if kind == "qkv":
        return [(_randn(64, 64, seed=13), "q"), (_randn(32, 64, seed=14) * 0.1, "k"), (_randn(32, 64, seed=15), "v")]
    return [(_randn(64, 128, seed=16), None)]


def _load(kind: str, ps: ParallelState):
    layer = _layers(kind, ps)
    for tensor, shard in _checkpoint(kind):
        layer.weight.weight_loader(layer.weight, tensor, shard)
    return layer


@pytest.mark.parametrize("kind", ["column", "merged", "qkv", "row"])
def test_quantizing_at_load_gives_each_output_channel_its_own_scale(kind):
    layer = _load(kind, ParallelState())
    full = torch.cat([t for t, _ in _checkpoint(kind)])  # one process: the shards stacked in order
    q, scale = quantize_rows(full)
    assert layer.weight.dtype == FP8 and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer.weight_scale, scale)


@pytest.mark.parametrize("kind", ["column", "merged", "qkv", "row"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_shards_are_slices_of_the_one_process_layer_scales_included(kind, world_size):
    one = _load(kind, ParallelState())
    for rank in range(world_size):
        shard = _load(kind, ParallelState(rank, world_size))
        if kind == "row":  # inputs split: weight columns sliced, every output channel (and scale) kept
            n = 128 // world_size
            want_w, want_s = one.weight[:, rank * n:(rank + 1) * n], one.weight_scale
        else:  # outputs split: scales travel with their rows
            rows = _column_rows(kind, rank, world_size)
            want_w, want_s = one.weight[rows], one.weight_scale[rows]
        assert torch.equal(shard.weight.view(torch.uint8), want_w.contiguous().view(torch.uint8))
        assert torch.equal(shard.weight_scale, want_s)


def _column_rows(kind: str, rank: int, ws: int) -> list[int]:
    if kind == "column":
        n = 128 // ws
        return list(range(rank * n, (rank + 1) * n))
    if kind == "merged":
        n = 128 // ws
        return list(range(rank * n, (rank + 1) * n)) + list(range(128 + rank * n, 128 + (rank + 1) * n))
    kv_rank = rank // max(1, ws // 2)  # 2 KV heads: replicated once ranks outnumber them
    q = list(range(rank * 64 // ws, (rank + 1) * 64 // ws))
    kv = 16 * max(1, 2 // ws)
    k = list(range(64 + kv_rank * kv, 64 + (kv_rank + 1) * kv))
    return q + k + [r + 32 for r in k]


def test_per_tensor_checkpoint_scales_expand_to_their_shards_channels():
    """vLLM's Fp8Config checkpoints keep one scale per q, k and v tensor; fused, each covers its own rows."""
    layer = QKVParallelLinear(64, 16, 4, 2, False, quant="fp8")
    scales = {"q": 0.5, "k": 0.25, "v": 2.0}
    rows = {"q": 64, "k": 32, "v": 32}
    for shard, s in scales.items():
        w = _randn(rows[shard], 64, seed=len(shard)).to(FP8)
        layer.weight.weight_loader(layer.weight, w, shard)
        layer.weight_scale.weight_loader(layer.weight_scale, torch.tensor(s), shard)
    want = torch.cat([torch.full((rows[k],), v) for k, v in scales.items()])
    assert torch.equal(layer.weight_scale, want)


def test_fp8_layer_output_is_close_to_the_float_layer():
    fp8 = _load("qkv", ParallelState())
    ref = QKVParallelLinear(64, 16, 4, 2, True)
    for tensor, shard in _checkpoint("qkv"):
        ref.weight.weight_loader(ref.weight, tensor, shard)
    bias = _randn(128, seed=17)
    fp8.bias.data.copy_(bias)
    ref.bias.data.copy_(bias)
    x = _randn(10, 64, seed=18)
    got, want = fp8(x), ref(x)
    assert ((got - want).norm() / want.norm()).item() < 0.05  # as for fp8_linear above


def test_unquantized_layers_keep_their_parameters():
    layer = QKVParallelLinear(64, 16, 4, 2, True)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]
    assert layer.weight.dtype == torch.get_default_dtype()


def test_fp8_linear_takes_batched_and_strided_inputs():
    w = _randn(48, 64, seed=19)
    q, scale = quantize_rows(w)
    x = _randn(3, 5, 128, seed=20)[..., ::2]  # [3, 5, 64], last stride 2
    got = fp8_linear(x, q, scale)
    assert got.shape == (3, 5, 48)
    torch.testing.assert_close(got.reshape(15, 48), fp8_linear(x.reshape(15, 64).contiguous(), q, scale))


def test_fp8_linear_of_an_already_quantized_activation_is_fp8_linear_of_the_activation():
    """A norm or SiLU-and-mul kernel that quantizes its own output hands fp8_linear (q, scale): the layer must then
    give exactly what it gives when it quantizes the same activation itself."""
    x, b = _randn(33, 64, seed=23).to(torch.bfloat16), _randn(48, seed=24).to(torch.bfloat16)
    q, scale = quantize_rows(_randn(48, 64, seed=25))
    xq, xs = quantize_per_token(x)
    got = fp8_linear(QuantizedActivation(xq, xs, torch.bfloat16), q, scale, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, fp8_linear(x, q, scale, b))


@pytest.fixture
def cublaslt_on_the_cpu(monkeypatch):
    """fp8_linear as on an FP8 GPU of 132 SMs, its GEMMs on the CPU: torch's CPU _scaled_mm takes the unit scalar
    scales of the cuBLASLt path; the row-wise call is stubbed (those tests check what kind of result comes back)."""
    monkeypatch.setattr(fp8_layer, "scaled_mm_supported", lambda device, dtype: True)
    monkeypatch.setattr(fp8_layer, "sm_count", lambda index: 132)
    monkeypatch.setattr(fp8_layer, "scaled_mm", lambda xq, xs, w, ws, b, dtype, fast_accum=False:
                        torch.zeros(xq.shape[0], w.shape[0], dtype=dtype))


def _bf16_operands(rows: int = 33):
    """A bf16 activation [rows, 64] and an FP8 weight [48, 64] with its scales."""
    q, scale = quantize_rows(_randn(48, 64, seed=31))
    return _randn(rows, 64, seed=30).to(torch.bfloat16), q, scale


@pytest.mark.parametrize("fp8_gemm", ["cublaslt", "cublaslt-fast", "auto"])  # auto: cuBLASLt at 33 x 48
def test_fp8_linear_defers_a_cublaslt_gemms_scales_when_asked(fp8_gemm, cublaslt_on_the_cpu):
    x, q, scale = _bf16_operands()
    got = fp8_linear(x, q, scale, None, fp8_gemm, defer_scales=True)
    assert isinstance(got, ScaledAccumulator) and got.acc.dtype == torch.float32 and got.dtype == torch.bfloat16
    want = fp8_linear(x, q, scale, None, fp8_gemm)
    assert isinstance(want, torch.Tensor) and torch.equal(got.materialize(), want)


@pytest.mark.parametrize("fp8_gemm, rows, bias, batched", [
    ("cublaslt", 33, True, False),  # the bias goes in the scales pass
    ("cublaslt", 33, False, True),  # [3, 11, 64]: an RMSNorm's fused path takes 2-D rows
    ("rowwise-fast", 33, False, False),  # the scales are in the GEMM's epilogue
    ("auto", 257, False, False),  # auto's row-wise kernel above CUBLASLT_MAX_TOKENS
])
def test_fp8_linear_returns_a_tensor_where_the_scales_cannot_wait(fp8_gemm, rows, bias, batched, cublaslt_on_the_cpu):
    x, q, scale = _bf16_operands(rows)
    b = _randn(48, seed=32).to(torch.bfloat16) if bias else None
    got = fp8_linear(x.view(3, 11, 64) if batched else x, q, scale, b, fp8_gemm, defer_scales=True)
    assert isinstance(got, torch.Tensor)


def test_the_reference_path_never_defers_the_scales():
    x, q, scale = _bf16_operands()
    got = fp8_linear(x, q, scale, None, "cublaslt", defer_scales=True)
    assert isinstance(got, torch.Tensor) and torch.equal(got, fp8_linear(x, q, scale, None, "cublaslt"))


@pytest.mark.parametrize("world_size, bias, quant, defers", [
    (1, False, "fp8", True), (1, True, "fp8", False), (2, False, "fp8", False), (1, False, None, False)])
def test_a_row_parallel_layer_defers_its_scales_only_where_nothing_stands_before_the_norm(
        world_size, bias, quant, defers, cublaslt_on_the_cpu, monkeypatch):
    """With TP the all-reduce, and a bias add, come between the GEMM and the norm: those keep today's tensor."""
    monkeypatch.setattr(ParallelState, "all_reduce", lambda self, x: x)  # one rank's partial sums for the sum
    layer = RowParallelLinear(128, 64, bias, ParallelState(0, world_size), dtype=torch.bfloat16, quant=quant)
    layer.weight.weight_loader(layer.weight, _randn(64, 128, seed=33).to(torch.bfloat16))
    if bias:
        layer.bias.data.copy_(_randn(64, seed=34))
    x = _randn(5, 128 // world_size, seed=35).to(torch.bfloat16)
    got = layer(x, defer_scales=True)
    assert isinstance(got, ScaledAccumulator) == defers
    assert torch.equal(got.materialize() if defers else got, layer(x))


@pytest.mark.parametrize("quantize_output", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_an_rms_norm_without_fused_kernels_applies_a_scaled_accumulators_scales_first(quantize_output,
                                                                                      with_residual):
    acc, xs, ws = _randn(6, 64, seed=36) * 3e4, _randn(6, 1, seed=37).abs() * 0.05, _randn(64, seed=38).abs() * 1e-4
    norm = RMSNorm(64, 1e-6, quantize_output=quantize_output)
    norm.weight.data = _randn(64, seed=39).abs().to(torch.bfloat16) + 0.5
    res = _randn(6, 64, seed=40).to(torch.bfloat16) if with_residual else None
    got = norm(ScaledAccumulator(acc, xs, ws, torch.bfloat16), res)
    want = norm(apply_scales_ref(acc, xs, ws, None, torch.bfloat16), res)
    for g, w in zip(got, want) if with_residual else [(got, want)]:
        assert g.dtype == torch.bfloat16 and torch.equal(g, w)


@needs_fp8_tensor_cores
@pytest.mark.parametrize("quantize_output", [False, True])
def test_a_row_parallel_layer_into_an_rms_norm_gives_the_same_bytes_with_its_scales_deferred_on_the_gpu(
        quantize_output):
    """The o_proj -> post-attention norm hand-off of a decode step: cuBLASLt, then the scales in the norm."""
    dev = torch.device("cuda")
    layer = RowParallelLinear(3584, 3584, False, dtype=torch.bfloat16, quant="fp8").to(dev)
    layer.weight.weight_loader(layer.weight, _randn(3584, 3584, seed=41, scale=0.02).to(dev))
    layer.fp8_gemm = "cublaslt-fast"
    norm = RMSNorm(3584, 1e-6, quantize_output=quantize_output).to(dev)
    norm.weight.data = (_randn(3584, seed=42).abs() + 0.5).to(dev, torch.bfloat16)
    x, res = _randn(64, 3584, seed=43).to(dev, torch.bfloat16), _randn(64, 3584, seed=44).to(dev, torch.bfloat16)
    deferred = layer(x, defer_scales=True)
    assert isinstance(deferred, ScaledAccumulator)
    (got, got_res), (want, want_res) = norm(deferred, res), norm(layer(x), res)
    assert torch.equal(got_res, want_res)
    if quantize_output:
        assert torch.equal(got.q.view(torch.uint8), want.q.view(torch.uint8)) and torch.equal(got.scale, want.scale)
    else:
        assert torch.equal(got, want)


AUTO_ON_TENSOR_CORES = ("torch._scaled_mm (FP8 tensor cores; cuBLASLt with fast accumulation, scales applied after up "
                        "to 256 tokens where the row-wise kernel would not fill the GPU, row-wise scales, fast "
                        "accumulation elsewhere)")


@pytest.mark.parametrize("capability, dtype, path", [
    ((9, 0), torch.bfloat16, AUTO_ON_TENSOR_CORES),
    ((8, 9), torch.bfloat16, AUTO_ON_TENSOR_CORES),
    ((8, 0), torch.bfloat16, "reference: dequantize then matmul (no FP8 tensor cores)"),
    ((9, 0), torch.float32, "reference: dequantize then matmul (a float32 model: the tensor-core path is for "
                            "bfloat16 models)"),
])
def test_the_gemm_path_follows_the_gpu_and_the_model_dtype(monkeypatch, capability, dtype, path):
    from railyard.engine.runner.layers import fp8

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    fp8._has_fp8_tensor_cores.cache_clear()
    try:
        assert fp8.gemm_path(torch.device("cuda"), dtype) == path
        assert fp8.gemm_path(torch.device("cpu"), torch.bfloat16).startswith("reference")
    finally:
        fp8._has_fp8_tensor_cores.cache_clear()
