"""The Triton FP8 paths compute what the torch references compute: per-token activation quantization
(bit for bit), the store-KV kernel into an FP8 or bf16 cache (byte for byte), and the decode and prefill
kernels over such a cache (as the torch backend over the same bytes).

Bit for bit because both follow one float32 recipe (layers/fp8.py): the first H200 run failed every
per-token case while torch computed `amax / 448` (on CUDA a multiplication by float32(1/448), in the
kernel a rounded division). The e4m3 rounding itself is checked on ties, subnormals and binade carries
with and without the round-to-odd step that GPUs below compute capability 9.0 need (kernels/fp8.py).

GPU when there is one, else Triton's CPU interpreter with the float32 -> e4m3 cast done as the GPU does
it (conftest.py); skipped where triton is not installed (CI, which runs test_fp8_kv_cache.py instead).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from railyard.engine.runner.kernels import fp8 as fp8_kernels  # noqa: E402
from railyard.engine.runner.kernels import fp8_gemm  # noqa: E402
from railyard.engine.runner.kernels import paged_attention  # noqa: E402
from railyard.engine.runner.kernels.paged_attention import paged_decode, store_kv  # noqa: E402
from railyard.engine.runner.layers.fp8 import (FP8, apply_scales_ref, dequantized_linear, quantize_per_token_ref,  # noqa: E402
                                        quantize_rows)
from tests.engine.runner.attention.paged_batch import DEVICE, random_batch  # noqa: E402

# The interpreter's float32 -> bfloat16 cast truncates; bf16 inputs are checked on the GPU only.
DTYPES = [torch.float32, torch.float16,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="interpreter bf16 casts"))]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [64, 96, 3584, 5000])  # one pass (<= 4096 wide) and two; non-powers of two
def test_per_token_quantization_kernel_is_bit_identical_to_torch(dtype, k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn((7, k), generator=g) * torch.logspace(-4, 3, 7)[:, None]  # seven decades of row scales
    x[3] = 0.0  # a padded row
    x = x.to(dtype).to(DEVICE)
    q, scale = fp8_kernels.quantize_per_token_triton(x)
    want_q, want_scale = quantize_per_token_ref(x)
    assert q.dtype == FP8 and q.shape == x.shape and scale.shape == (7, 1) and q.is_contiguous()
    assert torch.equal(scale, want_scale)
    assert torch.equal(_bits(q), _bits(want_q))


def test_per_token_quantization_kernel_reads_strided_rows():
    x = torch.randn((5, 2 * 96), generator=torch.Generator().manual_seed(0)).to(DEVICE)[:, :96]  # row stride 192
    q, scale = fp8_kernels.quantize_per_token_triton(x)
    want_q, want_scale = quantize_per_token_ref(x)
    assert torch.equal(scale, want_scale) and torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.float16])  # bf16 as float16: interpreter casts
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("n, with_bias", [(48, True), (48, False), (1000, True), (4608, True)])
def test_apply_scales_kernel_is_bit_identical_to_torch(out_dtype, n, with_bias, acc_dtype):
    """The pass after the unscaled cuBLASLt GEMM: widths under, over and at multiples of the kernel's block."""
    g = torch.Generator().manual_seed(n)
    acc = (torch.randn((9, n), generator=g) * 3e4).to(acc_dtype).to(DEVICE)  # sums of e4m3 products: large
    xs = (torch.rand((9, 1), generator=g) * 0.05 + 1e-4).to(DEVICE)
    ws = (torch.rand(n, generator=g) * 1e-4 + 1e-6).to(DEVICE)
    bias = torch.randn(n, generator=g).to(out_dtype).to(DEVICE) if with_bias else None
    got = fp8_kernels.apply_scales_triton(acc, xs, ws, bias, out_dtype)
    want = apply_scales_ref(acc, xs, ws, bias, out_dtype)
    assert got.dtype == out_dtype and got.shape == (9, n)
    assert torch.equal(got, want)


@pytest.mark.parametrize("config", [fp8_gemm.CONFIGS[0], fp8_gemm.CONFIGS[2], pytest.param(
    None, marks=pytest.mark.skipif(DEVICE == "cpu", reason="the autotuner times configs on a GPU"))])  # autotuned
@pytest.mark.parametrize("m, with_bias", [(3, True), (40, False)])
def test_triton_fp8_gemm_gives_what_the_dequantizing_reference_gives(m, with_bias, config):
    """The fp8_gemm="triton" path: the GEMM with both scales and the bias in its epilogue. Against the same
    e4m3 numbers dequantized into a float32 matmul: float32 output, so only the summation order (and on sm_90
    the per-BLOCK_K reduced-precision partial sums; tests/engine/runner/layers/test_fp8.py bounds those) differs."""
    g = torch.Generator().manual_seed(m)
    x, w = torch.randn((m, 256), generator=g), torch.randn((80, 256), generator=g) * 0.05  # N not a tile multiple
    bias = torch.randn(80, generator=g) if with_bias else None
    xq, xs = quantize_per_token_ref(x)
    q, ws = quantize_rows(w)
    want = dequantized_linear(xq, xs, q, ws, bias, torch.float32)
    got = fp8_gemm.fp8_gemm(xq.to(DEVICE), xs.to(DEVICE), q.to(DEVICE), ws.to(DEVICE),
                            None if bias is None else bias.to(DEVICE), torch.float32, config=config)
    magnitude = (xq.float().abs() * xs) @ (q.float().abs() * ws[:, None]).t()
    assert got.shape == (m, 80) and got.dtype == torch.float32
    assert ((got.cpu() - want).abs() <= 1e-5 * want.abs() + 2.0 ** -10 * magnitude).all()


def _rounding_cases() -> torch.Tensor:
    """float32 values where rounding to e4m3 can go wrong: exact ties (to even), one float32 step either side of
    them, subnormal ties, the carry into the next binade, the largest values, signed zeros."""
    ties = torch.tensor([1.0625, 1.1875, 15.5, 232.0, 248.0, 2.0 ** -10, 3 * 2.0 ** -10, 15 * 2.0 ** -10, 0.3125])
    inf = torch.full_like(ties, float("inf"))
    near = torch.cat([ties, torch.nextafter(ties, inf), torch.nextafter(ties, -inf),
                      torch.tensor([7.9375, 7.96875, 440.0, 447.9, 448.0, 0.0, -0.0])])
    return torch.cat([near, -near])


def _kernel_bytes(values: torch.Tensor, round_to_odd: bool, monkeypatch) -> list[torch.Tensor]:
    """`values` through the per-token kernel (a row whose amax is 448: scale 1.0, values pass as they are) and
    through store_kv (scale 1.0), with or without the round-to-odd step; the e4m3 bytes of each."""
    monkeypatch.setattr(fp8_kernels, "casts_through_fp16", lambda device: round_to_odd)
    monkeypatch.setattr(paged_attention, "casts_through_fp16", lambda device: round_to_odd)
    row = torch.cat([values, torch.tensor([448.0])])[None].to(DEVICE)
    q, scale = fp8_kernels.quantize_per_token_triton(row)
    assert scale.item() == 1.0
    n = values.numel()
    kv = values.reshape(n, 1, 1).to(DEVICE)
    cache = torch.zeros((2, n, 1, 1, 1), dtype=FP8, device=DEVICE)
    store_kv(cache, kv, kv, torch.arange(n, device=DEVICE))
    return [q[0, :-1].view(torch.uint8).cpu(), cache[0].reshape(-1).view(torch.uint8).cpu()]


@pytest.mark.parametrize("round_to_odd", [False, True])
def test_e4m3_rounding_is_torchs_at_ties_subnormals_and_binade_carries(monkeypatch, round_to_odd):
    """Both kernels' rounding, the direct cast (compute capability 9.0+) and with round-to-odd first (below it),
    against torch's float8_e4m3fn conversion (round to nearest, ties to even)."""
    values = _rounding_cases()
    for got in _kernel_bytes(values, round_to_odd, monkeypatch):
        assert torch.equal(got, values.to(FP8).view(torch.uint8))


@pytest.mark.skipif(DEVICE != "cpu", reason="emulates compute capability 8.9's cast in Triton's interpreter")
def test_round_to_odd_keeps_the_fp16_detour_below_sm90_rounding_as_torch(monkeypatch):
    """Below compute capability 9.0 Triton casts float32 to e4m3 as cvt.rz.f16.f32 then cvt.rn from fp16: emulated
    here by dropping the 13 low mantissa bits before the interpreter's (torch's) cast. That double rounding sends
    values just above a tie to the even neighbour below; rounded to odd first, every value rounds as torch's."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    cast = interp._convert_float

    def truncating_fp16_first(data, src, dst, rounding):
        if src == tl.float32 and dst == tl.float8e4nv:
            data = (np.ascontiguousarray(data).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
        return cast(data, src, dst, rounding)

    monkeypatch.setattr(interp, "_convert_float", truncating_fp16_first)
    values = _rounding_cases()
    want = values.to(FP8).view(torch.uint8)
    assert not any(torch.equal(got, want) for got in _kernel_bytes(values, False, monkeypatch))
    assert all(torch.equal(got, want) for got in _kernel_bytes(values, True, monkeypatch))


@pytest.mark.parametrize("cache_dtype, k_scale, v_scale",
                         [(FP8, 1.0, 1.0), (FP8, 0.37, 2.5), (torch.bfloat16, 1.0, 1.0)])
def test_store_kv_writes_the_bytes_the_torch_backend_writes(cache_dtype, k_scale, v_scale):
    q, k, v, cache, meta = random_batch([3, 20], [9, 1], 4, 2, 80, torch.float32, seed=5, cache_dtype=cache_dtype)
    k[0, 0, :2] = torch.tensor([1e4, -600.0], device=k.device)  # saturates at +-448 once divided
    if cache_dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("interpreter bf16 casts")
    ref, got = cache.clone(), cache.clone()
    torch_attn = TorchAttentionBackend(4, 2, 80, 0.1)
    torch_attn.k_scale, torch_attn.v_scale = k_scale, v_scale
    torch_attn.forward(q, k, v, ref, meta)
    store_kv(got, k, v, meta.slot_mapping, k_scale, v_scale)
    assert torch.equal(_bits(got), _bits(ref))


def _compare(cached, new, heads=4, kv_heads=2, dim=32, k_scale=1.0, v_scale=1.0, dtype=torch.float32, seed=0):
    q, k, v, cache, meta = random_batch(cached, new, heads, kv_heads, dim, dtype, seed, cache_dtype=FP8)
    ref_cache, got_cache = cache.clone(), cache.clone()
    backends = [TorchAttentionBackend(heads, kv_heads, dim, dim ** -0.5),
                TritonAttentionBackend(heads, kv_heads, dim, dim ** -0.5)]
    for b in backends:
        b.k_scale, b.v_scale = k_scale, v_scale
    ref = backends[0].forward(q, k, v, ref_cache, meta)
    got = backends[1].forward(q, k, v, got_cache, meta)
    assert torch.equal(_bits(got_cache), _bits(ref_cache)), "new K/V must land as the same bytes in the same slots"
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.5, 2.0)])
def test_decode_over_an_fp8_cache_matches_the_torch_backend(k_scale, v_scale):
    _compare(cached=[5, 40, 1, 77], new=[1, 1, 1, 1], k_scale=k_scale, v_scale=v_scale)


@pytest.mark.parametrize("k_scale, v_scale", [(1.0, 1.0), (0.5, 2.0)])
def test_prefill_after_prefix_hits_over_an_fp8_cache_matches_the_torch_backend(k_scale, v_scale):
    _compare(cached=[16, 24, 0], new=[5, 40, 17], k_scale=k_scale, v_scale=v_scale)


def test_fp8_decode_with_gqa_group_of_seven_and_head_dim_16():
    _compare(cached=[12, 33], new=[1, 1], heads=14, kv_heads=2, dim=16, k_scale=0.25, v_scale=3.0)


@pytest.mark.skipif(DEVICE == "cpu", reason="bf16 dot products: GPU only (interpreter bf16 casts)")
def test_bf16_queries_over_an_fp8_cache_with_7b_head_shapes(monkeypatch):
    monkeypatch.setattr(paged_attention, "fp8_dots", lambda q, kv_cache: False)  # float16 dots; FP8_DOTS: below
    _compare(cached=[0, 200, 999], new=[300, 1, 1], heads=28, kv_heads=4, dim=128, k_scale=0.5, v_scale=2.0,
             dtype=torch.bfloat16)


@pytest.mark.parametrize("cached, new", [([5, 40, 1, 77], [1, 1, 1, 1]), ([16, 24, 0], [5, 40, 17])])
def test_fp16_queries_over_an_fp8_cache_take_float16_dot_products_and_match_the_torch_backend(cached, new,
                                                                                            monkeypatch):
    """16-bit queries over an FP8 cache run both dot products in float16 (paged_attention.py's F16_DOTS: one
    e4m3 -> float16 conversion per two elements), q scaled by a power of two first; decode and prefill. (Decode
    on a Hopper GPU takes FP8 dots: they are turned off here.)"""
    monkeypatch.setattr(paged_attention, "fp8_dots", lambda q, kv_cache: False)
    _compare(cached=cached, new=new, heads=14, kv_heads=2, dim=64, k_scale=0.25, v_scale=3.0, dtype=torch.float16)


@pytest.mark.parametrize("q_multiplier", [1.0, 1e-3, 200.0])
def test_the_power_of_two_scaling_of_fp16_queries_changes_no_output(q_multiplier, monkeypatch):
    """For an fp16 q both paths take float16 dot products; the F16_DOTS one scales q by 2^k and the score scale by
    2^-k first, which commutes with every rounding: the outputs are the same bits (decode, one split and five)."""
    q, k, v, cache, meta = random_batch([300, 9, 150], [1, 1, 1], 14, 2, 64, torch.float16, seed=4, cache_dtype=FP8)
    q = q * q_multiplier
    store_kv(cache, k, v, meta.slot_mapping, 0.5, 2.0)
    for splits in (1, 5):
        args = (q, cache, meta.block_tables, meta.seq_lens, 0.125)
        scaled = paged_decode(*args, num_splits=splits, k_scale=0.5, v_scale=2.0, use_fp8_dots=False)
        monkeypatch.setattr(paged_attention, "_f16_dots", lambda q, kv_cache: False)
        plain = paged_decode(*args, num_splits=splits, k_scale=0.5, v_scale=2.0, use_fp8_dots=False)
        monkeypatch.undo()
        assert torch.equal(scaled, plain)


def test_bf16_queries_beyond_float16s_range_give_what_the_same_scores_give_within_it():
    """q * 2^17 (|q| far past float16's 65504) with the softmax scale / 2^17 has the same scores as q with the
    scale: the power-of-two normalisation before the float16 cast makes them the same bits, where a plain cast
    would give inf. (The interpreter's bf16 output rounding is the same in both runs.)"""
    q, k, v, cache, meta = random_batch([200, 9], [1, 1], 28, 4, 128, torch.bfloat16, seed=8, cache_dtype=FP8)
    store_kv(cache, k, v, meta.slot_mapping, 0.5, 2.0)
    big = q * 2.0 ** 17
    assert big.abs().max().item() > 65504
    want = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.088, num_splits=1, k_scale=0.5, v_scale=2.0)
    got = paged_decode(big, cache, meta.block_tables, meta.seq_lens, 0.088 * 2.0 ** -17, num_splits=1,
                       k_scale=0.5, v_scale=2.0)
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_split_context_decode_over_an_fp8_cache_equals_one_split():
    q, k, v, cache, meta = random_batch([300, 9, 150], [1, 1, 1], 4, 2, 32, torch.float32, seed=3, cache_dtype=FP8)
    store_kv(cache, k, v, meta.slot_mapping, 0.5, 2.0)
    one = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1, k_scale=0.5, v_scale=2.0)
    many = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=5, k_scale=0.5, v_scale=2.0)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=1e-5)


def test_decode_over_an_fp8_cache_gives_the_same_bits_three_stages_deep_and_under_a_register_cap():
    q, k, v, cache, meta = random_batch([300, 9, 150], [1, 1, 1], 4, 2, 32, torch.float32, seed=4, cache_dtype=FP8)
    store_kv(cache, k, v, meta.slot_mapping, 0.5, 2.0)
    assert paged_attention.decode_stages(cache) == 3 and paged_attention.decode_stages(cache.to(torch.bfloat16)) == 2
    default = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1, k_scale=0.5, v_scale=2.0)
    two = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1, k_scale=0.5, v_scale=2.0,
                       num_stages=2)
    assert torch.equal(default, two)
    capped = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.2, num_splits=1, k_scale=0.5, v_scale=2.0,
                          maxnreg=128)  # a register cap (more programs per SM) is the same arithmetic
    assert torch.equal(default, capped)


def test_a_cache_of_the_wrong_layout_is_refused():
    q, k, v, cache, meta = random_batch([3], [1], 4, 2, 32, torch.float32, seed=6, cache_dtype=FP8)
    with pytest.raises(ValueError, match="KV cache must be a contiguous"):
        store_kv(cache.transpose(1, 2), k, v, meta.slot_mapping)
    with pytest.raises(ValueError, match="KV cache must be a contiguous"):
        paged_decode(q, cache.to(torch.int8), meta.block_tables, meta.seq_lens, 0.2, num_splits=1)


def test_an_engine_on_the_triton_backend_generates_what_the_torch_backend_does_over_fp8(tmp_path):
    """Whole engine, FP8 weights and cache, float32 tiny model: same greedy tokens from both backends, also on a
    second pass served from the prefix cache (both backends store the same bytes; see the tests above)."""
    from railyard.engine.config import SamplingParams
    from railyard.engine.llm import LLM
    from railyard.engine.startup.tiny_model import write_tiny_checkpoint

    path = str(write_tiny_checkpoint(tmp_path / "qwen3", "qwen3"))
    prompts = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 17, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(path, device=DEVICE, dtype="float32", attention_backend=backend, kv_cache_dtype="fp8",
                  quantization="fp8", block_size=8, max_model_len=128, num_gpu_blocks=64)
        for run in (1, 2):
            tokens[backend, run] = [o.outputs[0].token_ids for o in
                                    llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)]
        assert llm.engine.stats().prefix_cache_hits > 0
    assert tokens["triton", 1] == tokens["triton", 2] == tokens["torch", 1] == tokens["torch", 2]


# -- FP8_DOTS: decode on FP8 tensor cores (paged_attention.py's module docstring) ------------------------------------
def _fp8_dots_against_the_torch_backend(heads, kv_heads, dim, cached, splits, seed, dtype=torch.float16):
    """(relative L2 error, smallest per-head cosine) of the FP8-dots decode against the torch backend's exact
    attention over the same FP8 bytes (float16 queries on the CPU: the interpreter's bf16 casts truncate)."""
    q, k, v, cache, meta = random_batch(cached, [1] * len(cached), heads, kv_heads, dim, dtype, seed,
                                        cache_dtype=FP8, page=16)
    torch_attn = TorchAttentionBackend(heads, kv_heads, dim, dim ** -0.5)
    torch_attn.k_scale, torch_attn.v_scale = 0.5, 2.0
    want = torch_attn.forward(q, k, v, cache.clone(), meta).float().view(len(cached), heads, dim)
    store_kv(cache, k, v, meta.slot_mapping, 0.5, 2.0)
    got = paged_decode(q, cache, meta.block_tables, meta.seq_lens, dim ** -0.5, num_splits=splits, k_scale=0.5,
                       v_scale=2.0, use_fp8_dots=True).float()
    cos = torch.nn.functional.cosine_similarity(got.reshape(-1, dim), want.reshape(-1, dim), dim=-1)
    return ((got - want).norm() / want.norm()).item(), cos.min().item()


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("heads, kv_heads, dim, cached", [(14, 2, 64, [5, 40, 1, 77]), (28, 4, 128, [0, 200, 130])])
def test_fp8_dots_decode_stays_within_e4m3_rounding_of_exact_attention(heads, kv_heads, dim, cached, splits):
    """q and P rounded to e4m3 (3 fraction bits: up to 2^-4 relative each) move the output by 0.7-2.2% in relative
    L2 here (per-head cosine >= 0.9989); the bounds leave ~2x. A wrong tile, page or scale gives O(1) errors."""
    rel, cos = _fp8_dots_against_the_torch_backend(heads, kv_heads, dim, cached, splits, seed=len(cached))
    assert rel < 0.045 and cos > 0.997


@pytest.mark.skipif(DEVICE == "cpu", reason="bf16 queries and wgmma: GPU only")
@pytest.mark.parametrize("splits", [1, 4])
def test_fp8_dots_decode_with_7b_head_shapes_and_long_contexts_on_the_gpu(splits):
    rel, cos = _fp8_dots_against_the_torch_backend(28, 4, 128, [0, 200, 999, 1500], splits, seed=11,
                                                   dtype=torch.bfloat16)
    assert rel < 0.045 and cos > 0.997


def test_fp8_dots_decode_of_an_empty_sequence_is_zero_and_other_rows_are_unchanged():
    """A padded CUDA-graph row has seq_len 0: its output is 0 (not NaN), and it changes no other row."""
    q, k, v, cache, meta = random_batch([40, 9], [1, 1], 14, 2, 64, torch.float16, seed=2, cache_dtype=FP8, page=16)
    store_kv(cache, k, v, meta.slot_mapping)
    full = paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.125, num_splits=1, use_fp8_dots=True)
    seq_lens = meta.seq_lens.clone()
    seq_lens[1] = 0
    for splits in (1, 2):
        got = paged_decode(q, cache, meta.block_tables, seq_lens, 0.125, num_splits=splits, use_fp8_dots=True)
        assert torch.equal(got[1], torch.zeros_like(got[1]))
        torch.testing.assert_close(got[0], full[0], atol=2e-3, rtol=2e-2)


def test_store_kv_writes_nan_as_zero_so_an_fp8_cache_never_holds_a_nan_byte():
    """The FP8-dots kernel reads the tail of a sequence's last block unmasked (weight 0): 0 * NaN would poison the
    output, so no NaN may ever be stored; the torch backend stores the same bytes."""
    q, k, v, cache, meta = random_batch([3], [4], 4, 2, 32, torch.float32, seed=9, cache_dtype=FP8)
    k[1, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], device=k.device)
    v[2, 1, 5] = float("nan")
    ref = cache.clone()
    store_kv(cache, k, v, meta.slot_mapping)
    TorchAttentionBackend(4, 2, 32, 0.1).forward(q, k, v, ref, meta)
    assert not cache.float().isnan().any() and torch.equal(_bits(cache), _bits(ref))


def test_fp8_dots_runs_only_for_16_bit_queries_over_an_fp8_cache_on_a_hopper_gpu():
    cache = torch.zeros((2, 4, 16, 2, 64), dtype=FP8)
    q16 = torch.zeros((1, 4, 64), dtype=torch.float16)
    assert not paged_attention.fp8_dots(q16, cache)  # CPU tensors: the interpreter only when a test asks
    if DEVICE == "cuda":
        want = torch.cuda.get_device_capability() >= (9, 0)
        assert paged_attention.fp8_dots(q16.cuda(), cache.cuda()) == want
        assert not paged_attention.fp8_dots(q16.float().cuda(), cache.cuda())  # float32 models: exact dots
        assert not paged_attention.fp8_dots(q16.cuda(), cache.to(torch.bfloat16).cuda())


def test_an_fp8_dots_tile_that_is_not_whole_blocks_is_refused():
    """Its value loads are declared runs of whole blocks: a tile that splits one is refused, not misread."""
    q, k, v, cache, meta = random_batch([40], [1], 4, 2, 64, torch.float16, seed=1, cache_dtype=FP8, page=16)
    with pytest.raises(ValueError, match="multiple of its 16-token blocks"):
        paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.125, num_splits=1, block_n=24, use_fp8_dots=True)
