"""The fused-MoE Triton path against the layer's torch reference (layers/moe.py): both grouped GEMMs with biases
and the routing weights in the epilogue, FP8 experts with block scales, MXFP4 experts read packed (tensor-parallel
slices padded to whole groups too). The slot list they read is test_moe_align.py's. On the GPU when there is one,
else in Triton's CPU interpreter."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import fused_moe  # noqa: E402
from railyard.engine.runner.kernels.fused_moe import align_by_expert, fused_experts  # noqa: E402
from railyard.engine.runner.layers.activation import silu_and_mul_native  # noqa: E402
from railyard.engine.runner.layers.fp8_block import (dequantize_blocks, dequantize_per_token_group,  # noqa: E402
                                                     quantize_blocks, quantize_per_token_group)
from railyard.engine.runner.layers.moe import (FusedMoE, experts_reference, experts_reference_fp8,  # noqa: E402
                                               quantize_experts, route_softmax_topk)
from railyard.engine.runner.layers.fp8 import FP8  # noqa: E402
from railyard.engine.runner.layers.mxfp4 import dequantize_mxfp4, quantize_mxfp4, to_kernel_layout  # noqa: E402
from railyard.engine.runner.layers.parallel import ParallelState  # noqa: E402
from railyard.engine.runner.layers.activation import ClampedSwiGLU, clamped_swiglu, silu_and_mul  # noqa: E402
from railyard.model.spec import MXFP4_WIDEN_SLOTS_PER_EXPERT  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA = DEVICE == "cuda"


def _routing(tokens: int, experts: int, top_k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return route_softmax_topk(torch.randn(tokens, experts, generator=gen) * 2, top_k, True)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize(("tokens", "top_k", "hidden", "dtype"), [
    (5, 4, 2880, torch.bfloat16), (3, 8, 64, torch.float32), (1, 1, 1500, torch.float16)])
def test_each_tokens_slots_are_summed_in_float32_and_rounded_once(tokens, top_k, hidden, dtype, weighted):
    """Each slot times its routing weight (the fused experts' last step), in float32, summed and rounded once. Bit
    for bit on the GPU; Triton's CPU interpreter narrows float32 by truncation, so there within one unit of the last
    place."""
    gen = torch.Generator().manual_seed(tokens)
    slots = (torch.randn(tokens * top_k, hidden, generator=gen) * 4).to(dtype)
    weights = torch.rand(tokens * top_k, generator=gen).to(dtype) if weighted else None
    got = fused_moe.sum_slots(slots.to(DEVICE), top_k, None if weights is None else weights.to(DEVICE))
    scaled = slots.float() * (weights.float()[:, None] if weighted else 1.0)
    exact = scaled.view(tokens, top_k, hidden).sum(dim=1)
    assert got.shape == (tokens, hidden) and got.dtype == dtype
    if CUDA:
        torch.testing.assert_close(got.cpu(), exact.to(dtype), rtol=0, atol=0)
    else:
        torch.testing.assert_close(got.float(), exact, rtol=torch.finfo(dtype).eps, atol=1e-30)


def _experts(experts: int, hidden: int, inter: int, seed: int, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.1
    b13 = torch.randn(experts, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) if bias else None
    return w13, w2, b13, b2


def _on(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("config", [fused_moe.SMALL, fused_moe.LARGE], ids=["small-tiles", "large-tiles"])
@pytest.mark.parametrize("tokens", [1, 3, 70])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "expert-biases"])
def test_fused_experts_give_the_reference_experts_output(config, tokens, bias):
    w13, w2, b13, b2 = _experts(8, 64, 32, seed=tokens, bias=bias)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(1))
    weights, ids = _routing(tokens, 8, 2, seed=tokens + 1)
    want = experts_reference(x, w13, w2, weights, ids, silu_and_mul_native, b13, b2)
    got = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, *_on(DEVICE, b13, b2),
                        config=config)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_fused_experts_with_a_gate_up_wider_than_one_tile_and_top_8_of_32():
    w13, w2, _, _ = _experts(32, 96, 80, seed=5)  # gate/up 160 rows: two 128-wide column blocks
    x = torch.randn(21, 96, generator=torch.Generator().manual_seed(2))
    weights, ids = _routing(21, 32, 8, seed=6)
    want = experts_reference(x, w13, w2, weights, ids)
    got = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, config=fused_moe.LARGE)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [False, True], ids=["one-projection", "gate-up-halves"])
def test_an_fp8_grouped_gemm_is_the_dequantized_product_to_the_accumulators_precision(split):
    """One FP8 grouped GEMM (weights by 128 x 128 blocks, activations by token and 128-wide group, routing weights in
    the epilogue) against the float64 product of the same numbers dequantized: each output within 2^-10 of the sum of
    its products' magnitudes. Exact in the interpreter; Hopper's FP8 tensor cores add each K step's products in fewer
    bits than float32 before the kernel scales them into its float32 accumulator (DeepSeek-V3's recipe)."""
    experts, n, k, tokens, top_k = 8, 320, 256, 24, 2
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(experts, n, k, generator=gen) * 0.1
    q = torch.empty(w.shape, dtype=FP8)
    s = torch.empty(experts, 4 if split else 3, 2)  # halves of 160 rows: 2 + 2 scale rows; else ceil(320 / 128)
    quantize_experts(w, q, s)
    xq, xs = quantize_per_token_group(torch.randn(tokens, k, generator=gen))
    weights, ids = _routing(tokens, experts, top_k, seed=13)
    config = fused_moe.FP8_LARGE
    out = torch.full((tokens * top_k, n), float("nan"), device=DEVICE)
    fused_moe.grouped_gemm(*_on(DEVICE, xq, q, out), align_by_expert(ids.to(DEVICE), experts, config[0]), top_k,
                           config, None, *_on(DEVICE, weights.reshape(-1), xs, s), n // 2 if split else None)
    a = dequantize_per_token_group(xq, xs, torch.float64)
    b = dequantize_blocks(q, s, torch.float64, split=n // 2 if split else None)
    rows, experts_of, scale = torch.arange(tokens * top_k) // top_k, ids.reshape(-1), weights.reshape(-1).double()
    want = torch.einsum("sk,snk->sn", a[rows], b[experts_of]) * scale[:, None]
    bound = torch.einsum("sk,snk->sn", a[rows].abs(), b[experts_of].abs()) * scale.abs()[:, None] * 2.0 ** -10
    assert ((out.cpu().double() - want).abs() <= bound + 1e-7).all()


@pytest.mark.parametrize(("hidden", "inter"), [(256, 160), (64, 32)], ids=["two-k-blocks-split-halves", "tiny"])
@pytest.mark.parametrize("tokens", [2, 40])
def test_fp8_fused_experts_give_the_block_scaled_reference(hidden, inter, tokens):
    """The same e4m3 numbers both ways, the kernel scaling each K step's partial sum where the reference dequantizes
    first, to within 1% in relative L2 (not float32 rounding: the activation between the GEMMs is rounded to e4m3
    again, so where the GPU's FP8 accumulation (the test above) moves a gate/up output across a rounding midpoint,
    that activation moves by a whole e4m3 step, 1/16 of itself)."""
    w13, w2, _, _ = _experts(8, hidden, inter, seed=7)
    q13, q2 = torch.empty(w13.shape, dtype=FP8), torch.empty(w2.shape, dtype=FP8)
    s13 = torch.empty(8, 2 * -(-inter // 128), -(-hidden // 128))
    s2 = torch.empty(8, -(-hidden // 128), -(-inter // 128))
    quantize_experts(w13, q13, s13)
    quantize_experts(w2, q2, s2)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3))
    weights, ids = _routing(tokens, 8, 2, seed=8)
    want = experts_reference_fp8(x, q13, s13, q2, s2, weights, ids)
    got = fused_experts(*_on(DEVICE, x, q13, q2, weights, ids), silu_and_mul_native, None, None,
                        *_on(DEVICE, s13, s2), config=fused_moe.FP8_LARGE).cpu()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    # and those numbers are the unquantized experts' to e4m3's precision
    full = experts_reference(x, w13, w2, weights, ids)
    assert ((got - full).norm() / full.norm()).item() < 0.1


def test_the_split_halves_scales_are_the_gate_and_up_projections_own():
    w13, _, _, _ = _experts(1, 64, 32, seed=9)
    q, s = torch.empty(w13.shape, dtype=FP8), torch.empty(1, 2, 1)
    quantize_experts(w13, q, s)
    for half in range(2):
        hq, hs = quantize_blocks(w13[0, half * 32:(half + 1) * 32])
        assert torch.equal(q[0, half * 32:(half + 1) * 32].view(torch.uint8), hq.view(torch.uint8))
        assert torch.equal(s[0, half], hs[0])


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_a_captured_graph_replays_new_routing_on_gpu():
    w13, w2, _, _ = _on("cuda", *_experts(16, 128, 64, seed=10))
    x = torch.randn(32, 128, device="cuda")
    weights, ids = _on("cuda", *_routing(32, 16, 4, seed=11))
    fused_experts(x, w13, w2, weights, ids, silu_and_mul_native)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, w13, w2, weights, ids, silu_and_mul_native)
    new_weights, new_ids = _on("cuda", *_routing(32, 16, 4, seed=12))
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.testing.assert_close(out, experts_reference(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)


def _mxfp4_experts(experts: int, hidden: int, inter: int, seed: int, bias: bool = False):
    """Random experts quantized to MXFP4 as checkpoints ship them (packed [E, N, K/2] bytes, [E, N, K/32] exponents:
    what the layer holds and the kernel reads), with the widened float32 weights they stand for (the reference's
    operands)."""
    w13, w2, b13, b2 = _experts(experts, hidden, inter, seed, bias)
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    q13, q2 = q13.reshape(experts, 2 * inter, hidden // 2), q2.reshape(experts, hidden, inter // 2)
    return (q13, s13, q2, s2, b13, b2), (dequantize_mxfp4(q13, s13, torch.float32),
                                         dequantize_mxfp4(q2, s2, torch.float32))


@pytest.mark.parametrize("kernel_layout", [False, True], ids=["checkpoint-order", "kernel-order"])
@pytest.mark.parametrize("config", [tile for _, tile in fused_moe.MXFP4_TILES] + [fused_moe.MXFP4_LARGE],
                         ids=lambda tile: "x".join(map(str, tile[:3])))
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 4, 1), (7, 8, 2), (37, 8, 4)])
def test_mxfp4_fused_experts_read_the_packed_weights_and_give_the_widened_reference(config, tokens, experts, top_k,
                                                                                     kernel_layout):
    """The kernel widens each packed tile in registers; the reference multiplies the whole widened experts: the same
    numbers, float32 rounding apart. Hidden 96 and intermediate 160: K steps that end inside a tile, with
    exponents spread over 2^-3..2^3 (each 32-group's own), biases on both projections; the bytes in checkpoint
    order or in the kernel's."""
    (q13, s13, q2, s2, b13, b2), (w13, w2) = _mxfp4_experts(experts, 96, 160, seed=tokens, bias=True)
    gen = torch.Generator().manual_seed(tokens)
    s13 = (s13.to(torch.int32) + torch.randint(-3, 4, s13.shape, generator=gen)).to(torch.uint8)
    w13 = dequantize_mxfp4(q13, s13, torch.float32)
    x = torch.randn(tokens, 96, generator=gen)
    weights, ids = _routing(tokens, experts, top_k, seed=tokens + 2)
    want = experts_reference(x, w13, w2, weights, ids, silu_and_mul_native, b13, b2)
    if kernel_layout:
        q13, q2 = to_kernel_layout(q13), to_kernel_layout(q2)
    got = fused_experts(*_on(DEVICE, x, q13, q2, weights, ids), silu_and_mul_native,
                        *_on(DEVICE, b13, b2, s13, s2), config=config, kernel_layout=kernel_layout)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)  # K summed in another order: by halves


@pytest.mark.parametrize(("block_m", "launch"), [(32, (4, 2)), (64, (8, 2, 80))], ids=["32-rows", "64-rows-capped"])
def test_an_mxfp4_row_block_whose_slots_fill_at_most_half_of_it_multiplies_that_half_alone(block_m, launch):
    """An expert's slots come first in its run, so a block whose slots end by its middle row takes a product half as
    tall: experts of exactly half a block, one slot more, a block and a few (a second block mostly empty) and one
    slot give each slot's row of the widened product, with the half-height path and without it (a tile may cap the
    registers a thread holds: its sixth number)."""
    experts, hidden, inter, half = 4, 64, 32, block_m // 2
    (q13, s13, *_), (w13, _) = _mxfp4_experts(experts, hidden, inter, seed=block_m)
    gen = torch.Generator().manual_seed(block_m)
    counts = (half, half + 1, block_m + 3, 1)
    ids = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)][:, None]
    x = torch.randn(ids.numel(), hidden, generator=gen)
    want = torch.einsum("sk,snk->sn", x, w13[ids[:, 0]])
    for half_rows in (True, False):
        out = torch.full((ids.numel(), 2 * inter), float("nan"), device=DEVICE)
        fused_moe.grouped_gemm(*_on(DEVICE, x, q13, out), align_by_expert(ids.to(DEVICE), experts, block_m), 1,
                               (block_m, 32, 64, *launch), w_scale=s13.to(DEVICE), half_rows=half_rows)
        torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel_layout", [False, True], ids=["checkpoint-order", "kernel-order"])
def test_mxfp4_tiles_decode_every_e2m1_code_and_exponent_as_the_reference_table(kernel_layout):
    """One expert whose weights run through all 16 codes under exponents 2^-27, 2^-7, 2^0 and 2^10: the kernel's
    bit-built values are the table's (multiplying by a one-hot x reads one weight column back exactly)."""
    hidden, inter = 128, 32
    codes = torch.arange(hidden * 2 * inter, dtype=torch.int64).reshape(2 * inter, hidden) % 16
    q13 = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)[None]
    s13 = torch.tensor([100, 120, 127, 137], dtype=torch.uint8).repeat(2 * inter, 1)[:, :hidden // 32][None]
    s13[0, inter:] = 127
    q2 = torch.full((1, hidden, inter // 2), 0x22, dtype=torch.uint8)  # all ones
    s2 = torch.full((1, hidden, inter // 32), 127, dtype=torch.uint8)
    w13 = dequantize_mxfp4(q13, s13, torch.float32)
    x = torch.eye(hidden)
    ids, weights = torch.zeros(hidden, 1, dtype=torch.int64), torch.ones(hidden, 1)
    identity_gate = lambda h: h[:, :inter] * h[:, inter:]  # noqa: E731
    want = experts_reference(x, w13, dequantize_mxfp4(q2, s2, torch.float32), weights, ids, identity_gate)
    if kernel_layout:
        q13, q2 = to_kernel_layout(q13), to_kernel_layout(q2)
    got = fused_experts(*_on(DEVICE, x, q13, q2, weights, ids), identity_gate, None, None,
                        *_on(DEVICE, s13, s2), kernel_layout=kernel_layout)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("kernel_layout", [False, True], ids=["checkpoint-order", "kernel-order"])
@pytest.mark.parametrize("tokens", [5, 40])
def test_mxfp4_fused_experts_in_bf16_give_the_bf16_kernel_on_the_widened_experts(tokens, kernel_layout):
    """bf16 activations (as models run): the tiles widened in registers are the very bf16 weights the widened experts
    hold (e2m1 times a power of two is exact in bf16), so the two kernels agree to their summation order."""
    (q13, s13, q2, s2, b13, b2), _ = _mxfp4_experts(8, 96, 64, seed=tokens, bias=True)
    x = torch.randn(tokens, 96, generator=torch.Generator().manual_seed(tokens)).to(torch.bfloat16)
    b13, b2 = b13.to(torch.bfloat16), b2.to(torch.bfloat16)
    w13, w2 = dequantize_mxfp4(q13, s13, torch.bfloat16), dequantize_mxfp4(q2, s2, torch.bfloat16)
    weights, ids = _routing(tokens, 8, 2, seed=tokens + 1)
    weights = weights.to(torch.bfloat16)
    want = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, *_on(DEVICE, b13, b2)).float()
    if kernel_layout:
        q13, q2 = to_kernel_layout(q13), to_kernel_layout(q2)
    got = fused_experts(*_on(DEVICE, x, q13, q2, weights, ids), silu_and_mul_native,
                        *_on(DEVICE, b13, b2, s13, s2), kernel_layout=kernel_layout).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.parametrize("kernel_layout", [False, True], ids=["checkpoint-order", "kernel-order"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_experts_widened_for_a_large_step_give_what_the_packed_path_gives(dtype, kernel_layout):
    """A step with many rows per expert widens each projection into a transient buffer and takes the dense-weight
    GEMM: the same experts' output as reading them packed (float32: the reference's; bf16: to summation order),
    through gpt-oss's clamped SwiGLU and biases."""
    (q13, s13, q2, s2, b13, b2), (w13, w2) = _mxfp4_experts(4, 64, 96, seed=21, bias=True)
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(24, 64, generator=gen).to(dtype)
    weights, ids = _routing(24, 4, 2, seed=22)
    act = functools.partial(clamped_swiglu, alpha=1.702, limit=7.0)
    stored = (to_kernel_layout(q13), to_kernel_layout(q2)) if kernel_layout else (q13, q2)
    args = (*_on(DEVICE, x, *stored, weights.to(dtype), ids), act,
            *_on(DEVICE, b13.to(dtype), b2.to(dtype), s13, s2))
    widened = fused_experts(*args, widen=True, kernel_layout=kernel_layout).float().cpu()
    packed = fused_experts(*args, widen=False, kernel_layout=kernel_layout).float().cpu()
    if dtype == torch.float32:
        want = experts_reference(x, w13, w2, weights, ids, act, b13, b2)
        torch.testing.assert_close(widened, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(packed, want, rtol=1e-4, atol=1e-4)
    else:
        assert ((widened - packed).norm() / packed.norm()).item() < 2e-2


_EPILOGUE_ACTIVATIONS = {  # the layers' activations, and the same function as one the kernel does not know
    "clamped-swiglu": (ClampedSwiGLU(1.702, 7.0), functools.partial(clamped_swiglu, alpha=1.702, limit=7.0)),
    "silu-and-mul": (silu_and_mul, lambda h: silu_and_mul(h))}


@pytest.mark.parametrize("activation", list(_EPILOGUE_ACTIVATIONS))
@pytest.mark.parametrize("widen", [False, True], ids=["packed", "widened"])
@pytest.mark.parametrize("config", [fused_moe.MXFP4_TILES[-1][1], (16, 64, 128, 4, 3)], ids=["decode", "small"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_activation_in_the_gate_up_epilogue_is_the_activation_of_the_stored_projection(dtype, config, widen,
                                                                                          activation):
    """The layers' gated activations (gpt-oss's ClampedSwiGLU, SiLU-and-mul) run in the gate/up GEMM's epilogue:
    each tile multiplies gate rows and the matching up rows, and stores their activation, rounded as the unfused
    kernel rounds the stored projection. The same numbers as the activation given as a function the kernel does not
    know (the gate/up projection stored, then activated), with an intermediate size the half tiles do not divide
    (160: 64 + 64 + 32 columns), row blocks that are full and ones filled at most halfway, packed and widened
    experts in the kernel's byte order. Bit for bit on the GPU; Triton's CPU interpreter narrows bf16 differently in
    the two kernels (and on the CPU the unfused SiLU-and-mul is torch's), and an up value near -1 (the clamped
    SwiGLU's (up + 1)) turns a last-place difference into a large relative one, so there the two agree to within a
    few units of the dtype's last place over the whole output."""
    fused_act, unfused_act = _EPILOGUE_ACTIVATIONS[activation]
    experts, hidden, inter, tokens = 4, 64, 160, 40
    (q13, s13, q2, s2, b13, b2), _ = _mxfp4_experts(experts, hidden, inter, seed=31, bias=True)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(31)).to(dtype)
    weights, ids = _routing(tokens, experts, 2, seed=32)
    ids[:4] = 0  # expert 0 gets more slots than a 32-row half block
    args = (*_on(DEVICE, x, to_kernel_layout(q13), to_kernel_layout(q2), weights.to(dtype), ids),)
    rest = dict(w13_bias=b13.to(dtype).to(DEVICE), w2_bias=b2.to(dtype).to(DEVICE), w13_scale=s13.to(DEVICE),
                w2_scale=s2.to(DEVICE), config=config, widen=widen, kernel_layout=True)
    fused = fused_experts(*args, fused_act, **rest)
    unfused = fused_experts(*args, unfused_act, **rest)
    if CUDA:
        torch.testing.assert_close(fused.cpu(), unfused.cpu(), rtol=0, atol=0)
    else:
        fused, unfused = fused.float(), unfused.float()
        assert ((fused - unfused).norm() / unfused.norm()).item() < 4 * torch.finfo(dtype).eps


def test_a_gated_projection_pairs_each_output_column_with_its_gate_and_up_rows():
    """grouped_gemm with gated=epilogue_activation(ClampedSwiGLU(...)), (kind, alpha, limit): out [slots, N / 2] is
    the clamped SwiGLU of the slots' gate/up products, gate rows first in w; checked against the activation of the
    plain product in float32."""
    experts, n, k, tokens = 2, 2 * 96, 64, 6
    gen = torch.Generator().manual_seed(33)
    w = torch.randn(experts, n, k, generator=gen) * 0.3
    x = torch.randn(tokens, k, generator=gen)
    _, ids = _routing(tokens, experts, 1, seed=34)
    config = (16, 64, 32, 4, 2)
    out = torch.full((tokens, n // 2), float("nan"), device=DEVICE)
    fused_moe.grouped_gemm(*_on(DEVICE, x, w, out), align_by_expert(ids.to(DEVICE), experts, config[0]), 1, config,
                           gated=fused_moe.epilogue_activation(ClampedSwiGLU(1.702, 7.0)))
    plain = torch.einsum("tk,tnk->tn", x, w[ids[:, 0]])
    torch.testing.assert_close(out.cpu(), clamped_swiglu(plain, 1.702, 7.0), rtol=1e-5, atol=1e-5)


def _descriptor_and_pointer_outputs(monkeypatch, descriptor: str, shape: tuple[int, int], launch) -> list:
    """launch(out) into a NaN-filled bf16 `out` of `shape`, first with the descriptors grouped_gemm builds, then with
    fused_moe.<descriptor> answering None (pointer loads): both outputs, on the CPU."""
    outs = []
    for use_descriptor in (True, False):
        if not use_descriptor:
            monkeypatch.setattr(fused_moe, descriptor, lambda *args: None)
        out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=DEVICE)
        launch(out)
        outs.append(out.cpu())
    return outs


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_tall_tiles_read_bf16_weights_through_a_descriptor_with_the_same_bits_as_pointer_loads(gated, monkeypatch):
    """A tall row block (a long step's) loads bf16 weight tiles through a tensor-memory-accelerator descriptor of
    w [E, G, N / G, K] (gated: a tile's gate rows and up rows as one load): the same numbers as the pointer loads,
    with N not a whole number of column blocks (the rows past an expert's N are the next expert's, never stored)
    and experts filling several row blocks, one block or none."""
    experts, n, k, tokens = 3, 2 * 96, 128, 70
    gen = torch.Generator().manual_seed(35)
    w = (torch.randn(experts, n, k, generator=gen) * 0.3).to(torch.bfloat16)
    x = torch.randn(tokens, k, generator=gen).to(torch.bfloat16)
    _, ids = _routing(tokens, experts, 2, seed=36)
    ids[:, 1] = torch.where(ids[:, 1] == 2, ids[:, 0], ids[:, 1])  # expert 2 gets fewer slots than one block
    config = fused_moe.LARGE
    assert fused_moe.weight_descriptor(w, *config[:3], gated) is not None
    act = fused_moe.epilogue_activation(ClampedSwiGLU(1.702, 7.0)) if gated else None
    routing = align_by_expert(ids.to(DEVICE), experts, config[0])
    outs = _descriptor_and_pointer_outputs(
        monkeypatch, "weight_descriptor", (tokens * 2, n // 2 if gated else n),
        lambda out: fused_moe.grouped_gemm(*_on(DEVICE, x, w, out), routing, 2, config, gated=act))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_only_tall_tiles_of_bf16_weights_the_copy_engine_can_address_take_a_descriptor():
    w = torch.zeros(2, 64, 128, dtype=torch.bfloat16)
    assert fused_moe.weight_descriptor(w, fused_moe.TMA_BLOCK_M, 64, 64, gated=True) is not None
    assert fused_moe.weight_descriptor(w, fused_moe.TMA_BLOCK_M // 2, 64, 64, gated=False) is None  # decode tiles
    assert fused_moe.weight_descriptor(w.float(), fused_moe.TMA_BLOCK_M, 64, 64, gated=False) is None
    assert fused_moe.weight_descriptor(w[:, :, :120], fused_moe.TMA_BLOCK_M, 64, 64, gated=False) is None
    assert fused_moe.weight_descriptor(w[:, :, :96], fused_moe.TMA_BLOCK_M, 64, 64, gated=False) is None  # K % 64


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("config", [tile for _, tile in fused_moe.MXFP4_TILES
                                    if tile[0] <= fused_moe.MXFP4_TMA_BLOCK_M],
                         ids=lambda tile: "x".join(map(str, tile[:3])))
def test_short_mxfp4_row_blocks_read_packed_tiles_through_a_descriptor_with_the_pointer_loads_bits(config, gated,
                                                                                                  monkeypatch):
    """The short row blocks (decode at a few slots per expert) take the kernel layout's packed tiles from the copy
    engine: the same products, bit for bit, as pointer loads of the same bytes; an intermediate of 160 puts the
    last column block past N (the descriptor's zeros there are never stored)."""
    experts, hidden, inter, tokens = 4, 128, 160, 9
    (q13, s13, *_), _ = _mxfp4_experts(experts, hidden, inter, seed=41)
    q13 = to_kernel_layout(q13)
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    _, ids = _routing(tokens, experts, 2, seed=42)
    assert fused_moe.mxfp4_descriptor(q13, config[1], config[2], gated) is not None
    act = fused_moe.epilogue_activation(ClampedSwiGLU(1.702, 7.0)) if gated else None
    routing = align_by_expert(ids.to(DEVICE), experts, config[0])
    outs = _descriptor_and_pointer_outputs(
        monkeypatch, "mxfp4_descriptor", (tokens * 2, inter if gated else 2 * inter),
        lambda out: fused_moe.grouped_gemm(*_on(DEVICE, x, q13, out), routing, 2, config, w_scale=s13.to(DEVICE),
                                           kernel_layout=True, gated=act))
    assert not outs[0].isnan().any()
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_only_packed_mxfp4_tiles_the_copy_engine_can_address_take_a_descriptor():
    q = torch.zeros(2, 64, 64, dtype=torch.uint8)  # [E, N, K / 2]: K 128
    assert fused_moe.mxfp4_descriptor(q, 64, 128, gated=True) is not None
    assert fused_moe.mxfp4_descriptor(q, 64, 64, gated=False) is not None  # a box row of 32 bytes
    assert fused_moe.mxfp4_descriptor(q, 64, 16, gated=False) is None  # 8 bytes: under the copy engine's 16
    assert fused_moe.mxfp4_descriptor(q[:, :, :40].contiguous(), 64, 64, gated=False) is None  # rows of 40 bytes
    assert fused_moe.mxfp4_descriptor(q[:, :63].contiguous(), 64, 64, gated=True) is None  # gate and up rows unequal


def test_the_layers_gated_activations_are_known_to_the_epilogue_and_others_are_not():
    assert fused_moe.epilogue_activation(ClampedSwiGLU(1.5, 6.0)) == (fused_moe.CLAMPED_SWIGLU.value, 1.5, 6.0)
    assert fused_moe.epilogue_activation(silu_and_mul) == (fused_moe.SILU_AND_MUL.value, 0.0, 0.0)
    assert fused_moe.epilogue_activation(silu_and_mul_native) is None
    assert fused_moe.epilogue_activation(functools.partial(clamped_swiglu, alpha=1.5, limit=6.0)) is None


def test_mxfp4_experts_are_widened_from_a_number_of_rows_per_expert():
    """Decode-sized calls read the packed bytes (they stream the weights); a call reaching
    MXFP4_WIDEN_SLOTS_PER_EXPERT slots per expert on average widens them."""
    per_expert = MXFP4_WIDEN_SLOTS_PER_EXPERT
    assert not fused_moe.widens_mxfp4(256 * 4, 32) and not fused_moe.widens_mxfp4(per_expert * 32 - 1, 32)
    assert fused_moe.widens_mxfp4(per_expert * 32, 32) and fused_moe.widens_mxfp4(16384 * 4, 32)


@pytest.mark.parametrize("rank", [2, 3], ids=["half-padded-rank", "all-padding-rank"])
def test_mxfp4_fused_experts_on_a_padded_tensor_parallel_slice_with_gpt_oss_activation(rank):
    """Intermediate 160 over 4 ranks: rank 2 holds 1 real group of its 2, rank 3 none; the kernel gives the layer's
    reference on the same padded slice, through gpt-oss's clamped SwiGLU and biases, top-4 of 8."""
    experts, hidden, inter = 8, 64, 160
    gen = torch.Generator().manual_seed(rank)
    moe = FusedMoE(experts, hidden, inter, ParallelState(rank, 4), bias=True, quant="mxfp4",
                   activation=ClampedSwiGLU(1.702, 7.0))  # as the gpt-oss layer holds it: run in the epilogue
    (q13, s13, q2, s2, b13, b2), _ = _mxfp4_experts(experts, hidden, inter, seed=rank, bias=True)
    for e in range(experts):
        for name, full in (("w13_weight", q13), ("w13_weight_scale", s13), ("w13_bias", b13)):
            moe.expert_loader(getattr(moe, name), full[e, :inter], (e, "gate"))
            moe.expert_loader(getattr(moe, name), full[e, inter:], (e, "up"))
        for name, full in (("w2_weight", q2), ("w2_weight_scale", s2), ("w2_bias", b2)):
            moe.expert_loader(getattr(moe, name), full[e], (e, "down"))
    x = torch.randn(9, hidden, generator=gen)
    weights, ids = _routing(9, experts, 4, seed=rank + 3)
    want = moe(x, weights, ids, reduce=False)  # the reference path on the CPU
    got = fused_experts(*_on(DEVICE, x, moe.w13_weight, moe.w2_weight, weights, ids), moe.activation,
                        *_on(DEVICE, moe.w13_bias, moe.w2_bias, moe.w13_weight_scale, moe.w2_weight_scale))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not CUDA, reason="gpt-oss-20b's expert shapes in bf16 want a GPU")
@pytest.mark.parametrize("tokens", [1, 7, 64, 513, 4096])
def test_mxfp4_fused_experts_on_gpt_oss_20b_shapes_in_bf16_on_gpu(tokens):
    """32 experts of 2880 -> 2880, top-4, rank 3 of 4's padded slice (21 real groups of 23): the kernel against the
    reference over the same bf16 numbers (e2m1 times a power of two is exact in bf16), to bf16's rounding; at 4,096
    tokens the experts are widened for the call."""
    experts, hidden, inter = 32, 2880, 2880
    torch.manual_seed(tokens)
    with torch.device("cuda"):
        moe = FusedMoE(experts, hidden, inter, ParallelState(3, 4), bias=True, quant="mxfp4", dtype=torch.bfloat16,
                       activation=ClampedSwiGLU(1.702, 7.0))
        for param in (moe.w13_weight, moe.w2_weight):
            param.data.copy_(torch.randint(0, 256, param.shape, dtype=torch.uint8))
        for param in (moe.w13_weight_scale, moe.w2_weight_scale):
            param.data.copy_(torch.randint(118, 124, param.shape, dtype=torch.uint8))
        moe.w13_bias.data.normal_(0, 0.1)
        moe.w2_bias.data.normal_(0, 0.1)
        moe.clear_padding()
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
        logits = torch.randn(tokens, experts)
    top, ids = torch.topk(logits, 4, dim=-1)
    weights = torch.softmax(top, dim=-1).to(torch.bfloat16)
    w13 = dequantize_mxfp4(moe.w13_weight, moe.w13_weight_scale, torch.bfloat16)
    w2 = dequantize_mxfp4(moe.w2_weight, moe.w2_weight_scale, torch.bfloat16)
    want = experts_reference(x, w13, w2, weights, ids, moe.activation, moe.w13_bias, moe.w2_bias).float()
    moe.weights_filled()  # as a load leaves them: the bytes in the kernel's order
    assert moe.kernel_layout
    got = moe(x, weights, ids, reduce=False).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_a_captured_mxfp4_graph_replays_new_routing_on_gpu():
    (q13, s13, q2, s2, b13, b2), (w13, w2) = _mxfp4_experts(16, 128, 64, seed=13, bias=True)
    q13, s13, q2, s2, b13, b2, w13, w2 = _on("cuda", q13, s13, q2, s2, b13, b2, w13, w2)
    x = torch.randn(32, 128, device="cuda")
    weights, ids = _on("cuda", *_routing(32, 16, 4, seed=14))

    def call():
        return fused_experts(x, q13, q2, weights, ids, silu_and_mul_native, b13, b2, s13, s2)

    call()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    new_weights, new_ids = _on("cuda", *_routing(32, 16, 4, seed=15))
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    want = experts_reference(x, w13, w2, weights, ids, silu_and_mul_native, b13, b2)
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)


def _shared_bytes(tile, element_bytes: int) -> int:
    bm, bn, bk, _, stages, *_cap = tile
    return stages * (bm * bk + bk * bn) * element_bytes


@pytest.mark.parametrize("per_expert", [1, 4, 12, 24, 100])
def test_tiles_fit_shared_memory_for_float32_activations_and_stay_as_tuned_for_bf16(per_expert):
    """The tables are tuned for 2-byte activations; float32 ones double every pipeline stage, and the wide tile
    asked for 294,912 bytes of an H100's 232,448 (Triton's OutOfResources on the GPU)."""
    slots, experts = per_expert * 64, 64
    for fp8, mxfp4 in ((False, False), (False, True)):
        tuned = fused_moe.pick_config(slots, experts, fp8, mxfp4)
        assert _shared_bytes(tuned, 2) <= fused_moe.SHARED_MEMORY_BUDGET
        wide = fused_moe.pick_config(slots, experts, fp8, mxfp4, element_bytes=4)
        assert _shared_bytes(wide, 4) <= fused_moe.SHARED_MEMORY_BUDGET
        assert wide[:2] == tuned[:2] and wide[3] == tuned[3]  # the same output tile and warps
        assert wide[2] >= 32 and wide[4] >= 2 and wide[2] % fused_moe.MXFP4_GROUP == 0
    assert fused_moe.fit_shared_memory((32, 256, 128, 4, 2), 4) == (32, 256, 64, 4, 2)
    assert fused_moe.pick_config(slots, experts, True, element_bytes=4) == fused_moe.pick_config(slots, experts, True)


def test_a_tile_asked_for_by_name_is_fitted_to_float32_activations_like_the_tables():
    """LARGE asks for 294,912 bytes of shared memory with float32 activations (over an H100's 232,448): fused_experts
    fits it as pick_config fits the tables' tiles, and gives the reference's output."""
    assert _shared_bytes(fused_moe.LARGE, 4) > 232_448
    fitted = fused_moe.fit_shared_memory(fused_moe.LARGE, 4)
    assert _shared_bytes(fitted, 4) <= fused_moe.SHARED_MEMORY_BUDGET and fitted[:2] == fused_moe.LARGE[:2]
    w13, w2, _, _ = _experts(8, 64, 32, seed=3)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    weights, ids = _routing(5, 8, 2, seed=4)
    got = fused_experts(*_on(DEVICE, x, w13, w2, weights, ids), silu_and_mul_native, config=fused_moe.LARGE)
    torch.testing.assert_close(got.cpu(), experts_reference(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)
