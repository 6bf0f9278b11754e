"""Triton kernels for paged attention over the KV cache layout [2, num_blocks, block_size, kv_heads, head_dim]
(an FP8 cache's value blocks keep tokens innermost, [kv_heads, head_dim, block_size]: attention/kv_layout.py).

- `store_kv`: writes a step's new keys/values at their flat slots (slot < 0 is skipped, so padded
  rows of a CUDA-graph batch write nothing).
- `paged_decode`: one query token per sequence. A program handles all query heads of one KV head
  (GQA: each key/value is read once per group) over one split of the context; splits are merged by
  `_merge_splits`. Splitting long contexts keeps the GPU full when the batch is small; the split
  count depends only on the batch shape, so it is fixed inside a captured graph.
- `paged_prefill`: varlen causal attention of each sequence's new queries over its whole cached
  context (prefix-cache hits and earlier chunks included) read straight from the paged cache.

Softmax runs in float32 with exp2; float32 models use IEEE dot products (not TF32) so greedy
outputs match a float32 reference.

The cache may be narrower than q (bf16 or float8_e4m3fn): `store_kv` rounds into it, the attention
kernels widen each tile to q's dtype in registers (exact). An FP8 cache has one K and one V scale per
layer: stored values are k / k_scale (k times the scale's float32 reciprocal), the kernels fold k_scale
into the softmax scale and multiply the output by v_scale, so the inner loop does no extra work.

An FP8 cache under 16-bit queries (F16_DOTS) runs both dot products in float16, whatever q's dtype: Triton
widens e4m3 to float16 with one packed conversion per two elements (cvt.rn.f16x2.e4m3x2), to bfloat16 only through
two more, and every e4m3 value is exact in float16. q is scaled by a power of two that brings its largest element
into [2^14, 2^15) before its float16 cast (exact, and no overflow for a bf16 q beyond float16's range), and the
score scale takes the inverse power, so the scores are what the bf16 dot product gives, up to accumulation order.
The softmax weights p in [0, 1] round to float16 (11 significant bits, against bf16's 8) for the P.V product.

FP8_DOTS (decode over an FP8 cache under 16-bit queries on Hopper, `fp8_dots`): the F16_DOTS loop is bound by
instructions per token, not bytes (the widening conversions, and q reloaded from shared memory each tile, since
Triton gives 16-row dots mma.sync), so it took as long as a bf16 cache for half the bytes. _decode_fp8_dots_kernel
puts the tokens in wgmma's 64-row dimension (S^T = K q^T, O^T = V^T P^T) and feeds the cache's bytes to FP8 tensor
cores as they are: q is cast to e4m3 (scaled so its largest element is 256), and so is P (times 256). That is what
vLLM does on Hopper with an FP8 cache and FlashAttention 3. It changes the arithmetic: the output moves ~1-3% in
relative L2 from the float16-dots kernel's on random data (tests/engine/runner/attention/test_fp8_kernels.py
bounds it; BENCHMARKS.md, FP8, has the per-layer and logit effect on a 7B shape).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from railyard.engine.runner.attention.kv_layout import values_tokens_inner
from railyard.engine.runner.kernels.fp8 import casts_through_fp16, to_e4m3
from railyard.engine.runner.layers.fp8 import reciprocal

_LOG2E = 1.4426950408889634


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr, k_inv, v_inv,
                     k_stride_t, k_stride_h, v_stride_t, v_stride_h, plane_stride,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                     H_PAD: tl.constexpr, D_PAD: tl.constexpr, FP8: tl.constexpr, ROUND_TO_ODD: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, H_PAD)
        d = tl.arange(0, D_PAD)
        mask = (h < NUM_KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :], mask=mask)
        v = tl.load(v_ptr + t * v_stride_t + h[:, None] * v_stride_h + d[None, :], mask=mask)
        dst = slot * (NUM_KV_HEADS * HEAD_DIM) + h[:, None] * HEAD_DIM + d[None, :]
        if FP8:  # times the float32 reciprocal of the layer's scale (as layers.fp8.quantize_kv), NaN as 0, saturate,
            # round: an FP8 cache never holds a NaN byte, so the FP8_DOTS kernel may read a block's tail unmasked
            k = k.to(tl.float32) * k_inv
            v = v.to(tl.float32) * v_inv
            k = tl.minimum(tl.maximum(tl.where(k != k, 0.0, k), -448.0), 448.0)
            v = tl.minimum(tl.maximum(tl.where(v != v, 0.0, v), -448.0), 448.0)
            tl.store(cache_ptr + dst, to_e4m3(k, ROUND_TO_ODD), mask=mask)
            # value blocks [kv_heads, head_dim, PAGE], tokens innermost (attention.kv_layout)
            v_dst = (slot // PAGE) * (PAGE * NUM_KV_HEADS * HEAD_DIM) + (h[:, None] * HEAD_DIM + d[None, :]) * PAGE \
                + slot % PAGE
            tl.store(cache_ptr + plane_stride + v_dst, to_e4m3(v, ROUND_TO_ODD), mask=mask)
        else:
            tl.store(cache_ptr + dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
            tl.store(cache_ptr + plane_stride + dst, v.to(cache_ptr.dtype.element_ty), mask=mask)


def store_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """kv_cache [2, nb, bs, hk, d] (contiguous); k, v [T, hk, d] (any row/head strides, unit last stride).

    A cache narrower than k/v (bf16, FP8) stores them rounded to its dtype; an FP8 cache stores k and v times
    the float32 reciprocals of k_scale and v_scale, saturated to e4m3's range: the bytes
    layers.fp8.quantize_kv makes."""
    t, hk, d = k.shape
    if t == 0:
        return
    _check_cache(kv_cache, hk, d)
    assert k.stride(2) == 1 and v.stride(2) == 1 and v.shape == k.shape and slot_mapping.shape == (t,)
    _store_kv_kernel[(t,)](
        k, v, kv_cache, slot_mapping, reciprocal(k_scale), reciprocal(v_scale), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), kv_cache.stride(0),
        NUM_KV_HEADS=hk, HEAD_DIM=d, PAGE=kv_cache.shape[2], H_PAD=triton.next_power_of_2(hk),
        D_PAD=triton.next_power_of_2(d),
        FP8=kv_cache.dtype == torch.float8_e4m3fn, ROUND_TO_ODD=casts_through_fp16(kv_cache.device),
        num_warps=1 if hk * d <= 512 else 4)


def _check_cache(kv_cache: torch.Tensor, hk: int, d: int) -> None:
    """The layout every kernel here indexes by hand: a wrong one would read or write the wrong bytes."""
    if not (kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3:] == (hk, d)
            and kv_cache.is_contiguous() and kv_cache.dtype in _CACHE_DTYPES):
        raise ValueError(f"KV cache must be a contiguous [2, blocks, block_size, {hk}, {d}] tensor of "
                         f"{', '.join(map(str, _CACHE_DTYPES))}; got {tuple(kv_cache.shape)} {kv_cache.dtype}")


_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _f16_dots(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """An FP8 cache under 16-bit queries: both dot products in float16 (the module docstring says why)."""
    return kv_cache.dtype == torch.float8_e4m3fn and q.dtype in (torch.bfloat16, torch.float16)


@functools.cache
def _has_wgmma(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def fp8_dots(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether decode over this cache runs _decode_fp8_dots_kernel: an FP8 cache, 16-bit queries, a Hopper (or
    newer) GPU, head dims and blocks its tiles take (the module docstring says why, and what it rounds)."""
    page, d = kv_cache.shape[2], kv_cache.shape[4]
    return (_f16_dots(q, kv_cache) and q.is_cuda and _has_wgmma(q.device.index or 0)
            and d in (64, 128) and 8 <= page <= 64 and 64 % page == 0)  # head dims the tests ran


def _kv_scales(kv_cache: torch.Tensor, scale: float, k_scale: float, v_scale: float) -> tuple[float, bool]:
    """The kernels' score scale (log2 domain, an FP8 cache's k_scale folded in) and whether to scale V."""
    if kv_cache.dtype != torch.float8_e4m3fn:
        return scale * _LOG2E, False
    return scale * k_scale * _LOG2E, v_scale != 1.0


@triton.jit
def _f16_queries(q, qk_scale):
    """q (16-bit) -> (q * 2^k as float16, qk_scale * 2^-k): 2^k brings max |q| into [2^14, 2^15) (k clamped so
    both powers stay normal float32), so the cast is exact for every element within 2^29 of that maximum and
    the scores s * qk_scale come out as from q itself (scaling by a power of two commutes with each rounding)."""
    amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # amax's biased exponent (0 for zero)
    k = tl.minimum(tl.maximum(268 - e, 1), 253)  # biased exponent of 2^(14 - (e - 127))
    up = (k << 23).to(tl.float32, bitcast=True)
    down = ((254 - k) << 23).to(tl.float32, bitcast=True)
    return (q.to(tl.float32) * up).to(tl.float16), qk_scale * down


@triton.jit
def _window_start(last_pos, WINDOW: tl.constexpr):
    """The first token a query at position last_pos sees: last_pos - WINDOW + 1 under a sliding window of WINDOW
    tokens (HF's kv_idx > q_idx - sliding_window), else 0."""
    lo = last_pos * 0
    if WINDOW > 0:
        lo = tl.maximum(last_pos - WINDOW + 1, 0)
    return lo


@triton.jit
def _fold_sinks(acc, m, l, sinks_ptr, heads, hmask):
    """A learned sink logit per head (natural-log units, as the model adds it beside the scaled scores) joins the
    softmax denominator: (acc, l) of rows `heads` rescaled to the new running maximum, l plus the sink's weight."""
    sink = tl.load(sinks_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
    m_new = tl.maximum(m, sink)
    alpha = tl.exp2(m - m_new)
    return acc * alpha[:, None], l * alpha + tl.exp2(sink - m_new)


@triton.jit
def _value_tile(cache_ptr, plane_stride, bt_row, start, end, valid, d, dmask, kvh, HEAD_DIM: tl.constexpr,
                NUM_KV_HEADS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The values of tokens start .. start + BLOCK_N (a whole number of pages from a page boundary) as
    [BLOCK_N, D_PAD], from value blocks that keep tokens innermost (an FP8 cache: attention.kv_layout): each page's
    [head_dim, PAGE] run is loaded as it lies, in 16-byte copies, then turned token-major in registers. Tokens not
    `valid` (past `end` in the last page) read as zero."""
    PAGES: tl.constexpr = BLOCK_N // PAGE
    first = start + tl.arange(0, PAGES) * PAGE
    page = tl.load(bt_row + first // PAGE, mask=first < end, other=0).to(tl.int64)
    base = page * (PAGE * NUM_KV_HEADS * HEAD_DIM) + kvh * (HEAD_DIM * PAGE)
    t = tl.arange(0, PAGE)
    v = tl.load(cache_ptr + plane_stride + base[:, None, None] + d[None, :, None] * PAGE + t[None, None, :],
                mask=(first < end)[:, None, None] & dmask[None, :, None], other=0.0)
    v = tl.reshape(tl.permute(v, (0, 2, 1)), (BLOCK_N, v.shape[1]))
    return tl.where(valid[:, None], v, 0.0)


@triton.jit
def _attend_tile(q, acc, m, l, cache_ptr, bt_row, start, end, toks, valid, score_mask, d, dmask, kvh, qk_scale,
                 plane_stride, HEAD_DIM: tl.constexpr, NUM_KV_HEADS: tl.constexpr, PAGE: tl.constexpr,
                 IEEE: tl.constexpr, BLOCK_N: tl.constexpr, V_TOKENS_INNER: tl.constexpr):
    """Fold one tile of paged keys/values (tokens `toks` = start .. start + BLOCK_N, `valid` below end) into the
    running softmax (acc, m, l) of the query rows q; score_mask [rows, tile] says which scores count. Shared by
    the decode and prefill kernels, so both read the cache and round the same way. A narrower cache (bf16,
    FP8) widens to q's dtype exactly; an FP8 cache's scales are the callers' (qk_scale, v_scale), and its value
    blocks keep tokens innermost (V_TOKENS_INNER)."""
    page = tl.load(bt_row + toks // PAGE, mask=valid, other=0).to(tl.int64)
    off = (page * PAGE + toks % PAGE) * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM
    kv_mask = valid[:, None] & dmask[None, :]
    k = tl.load(cache_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(score_mask, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing to attend to yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, 1)
    if V_TOKENS_INNER:
        v = _value_tile(cache_ptr, plane_stride, bt_row, start, end, valid, d, dmask, kvh, HEAD_DIM, NUM_KV_HEADS,
                        PAGE, BLOCK_N).to(q.dtype)
    else:
        v = tl.load(cache_ptr + plane_stride + off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l


# Per-step values (block-table width, split count) are not specialised on: a new value must not cost a
# JIT compile in the middle of serving.
@triton.jit(do_not_specialize=["bt_stride", "num_splits"])
def _decode_split_kernel(q_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, part_acc_ptr, part_ml_ptr,
                         out_ptr, qk_scale, v_scale, q_stride_t, q_stride_h, out_stride_t, out_stride_h, bt_stride,
                         plane_stride, num_splits,
                         NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                         G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                         PAGE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, DIRECT: tl.constexpr,
                         SCALE_V: tl.constexpr, F16_DOTS: tl.constexpr = False,
                         V_TOKENS_INNER: tl.constexpr = False, sinks_ptr=None, WINDOW: tl.constexpr = 0,
                         HAS_SINKS: tl.constexpr = False):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # A sliding window splits only the pages it sees (those before it may be freed: their table entries unread).
    lo = _window_start(seq_len - 1, WINDOW)
    first_page = lo // PAGE
    pages_per_split = tl.cdiv(tl.cdiv(seq_len, PAGE) - first_page, num_splits)
    tok_start = (first_page + split * pages_per_split) * PAGE
    tok_end = tl.minimum(seq_len, tok_start + pages_per_split * PAGE)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + b * q_stride_t + heads[:, None] * q_stride_h + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    if F16_DOTS:
        q, qk_scale = _f16_queries(q, qk_scale)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    bt_row = block_tables_ptr + b.to(tl.int64) * bt_stride
    for start in range(tok_start, tok_end, BLOCK_N):
        toks = start + tl.arange(0, BLOCK_N)
        valid = (toks < tok_end) & (toks >= lo)
        acc, m, l = _attend_tile(q, acc, m, l, cache_ptr, bt_row, start, tok_end, toks, valid, valid[None, :], d,
                                 dmask, kvh, qk_scale, plane_stride, HEAD_DIM, NUM_KV_HEADS, PAGE, IEEE, BLOCK_N,
                                 V_TOKENS_INNER)
    if SCALE_V:  # an FP8 cache's V scale: the partials are linear in acc, so scaling here is scaling the output
        acc = acc * v_scale
    if DIRECT:  # one split: normalise here, as the merge would (same operations, same result)
        if HAS_SINKS:
            acc, l = _fold_sinks(acc, m, l, sinks_ptr, heads, gmask)
        out = acc / tl.maximum(l, 1e-30)[:, None]
        tl.store(out_ptr + b * out_stride_t + heads[:, None] * out_stride_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
        return
    # partials: acc [B, H, S, D], (m, l) [B, H, S, 2]
    row = (b * NUM_HEADS + heads) * num_splits + split
    tl.store(part_acc_ptr + row[:, None] * D_PAD + d[None, :], acc, mask=gmask[:, None])
    tl.store(part_ml_ptr + row * 2, m, mask=gmask)
    tl.store(part_ml_ptr + row * 2 + 1, l, mask=gmask)


@triton.jit(do_not_specialize=["bt_stride", "num_splits"])
def _decode_fp8_dots_kernel(q_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, part_acc_ptr, part_ml_ptr,
                            out_ptr, qk_scale, v_scale, q_stride_t, q_stride_h, out_stride_t, out_stride_h,
                            bt_stride, plane_stride, num_splits,
                            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                            G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                            DIRECT: tl.constexpr, sinks_ptr=None, WINDOW: tl.constexpr = 0,
                            HAS_SINKS: tl.constexpr = False):
    """Decode over an FP8 cache with both products on FP8 tensor cores (FP8_DOTS; the module docstring says why):
    the tokens are the MMA's 64-row side, S^T = K q^T and O^T = V^T P^T, so K and V enter as the cache's bytes.
    q is scaled per program so its largest element is 256 and cast to e4m3; P (in [0, 1]) is cast as P * 256;
    both scales are divided out in float32. V blocks keep tokens innermost (attention.kv_layout), which is the
    layout V^T's operand wants. Partials and the direct output as _decode_split_kernel's."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # Splits of whole tiles: each tile starts at a multiple of BLOCK_N (so of PAGE), which the compiler sees, so it
    # copies each page's 16-byte runs of keys and values as such, asynchronously, a few tiles ahead.
    # A sliding window: only the tiles it reaches, and within them only its tokens (masked loads, so the table
    # entries of pages before it, which may be freed, are not read).
    lo = _window_start(seq_len - 1, WINDOW)
    first_tile = lo // BLOCK_N
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N) - first_tile, num_splits)
    tile_start = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tl.cdiv(seq_len, BLOCK_N), tile_start + tiles_per_split)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_DIM)
    gmask = g < GROUP
    heads = kvh * GROUP + g
    q = tl.load(q_ptr + b * q_stride_t + heads[:, None] * q_stride_h + d[None, :], mask=gmask[:, None],
                other=0.0).to(tl.float32)
    q_up = 256.0 / tl.maximum(tl.max(tl.max(tl.abs(q), 1), 0), 1e-30)
    q_t = tl.trans((q * q_up).to(tl.float8e4nv))  # [HEAD_DIM, G_PAD]
    qk_scale = qk_scale / q_up
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc_t = tl.zeros([HEAD_DIM, G_PAD], tl.float32)
    bt_row = block_tables_ptr + b.to(tl.int64) * bt_stride
    n = tl.arange(0, BLOCK_N)
    for tile in range(tile_start, tile_end):
        toks = tile * BLOCK_N + n
        valid = (toks < seq_len) & (toks >= lo)
        # Each page's entry is read for all its tokens or none (whether the window or the end cuts it): the value
        # load below promises the compiler runs of PAGE tokens from one page, and a page that the window starts
        # inside would otherwise mix page 0 (its masked tokens) with its own (read as one 16-byte copy: page 0's).
        first = toks // PAGE * PAGE
        page = tl.load(bt_row + toks // PAGE, mask=(first < seq_len) & (first + PAGE > lo), other=0).to(tl.int64)
        # Tokens past the end read finite bytes (a stale or zeroed block: store_kv stores NaN as 0, so an FP8 cache
        # holds no NaN) whose scores are masked to -inf and whose weights are 0.
        k = tl.load(cache_ptr + ((page * PAGE + toks % PAGE) * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM)[:, None]
                    + d[None, :])  # [BLOCK_N, HEAD_DIM]
        s_t = tl.dot(k, q_t)  # [BLOCK_N, G_PAD]
        s_t = tl.where(valid[:, None], s_t * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s_t, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p_t = tl.exp2(s_t - m_safe[None, :])
        alpha = tl.exp2(m - m_safe)
        l = l * alpha + tl.sum(p_t, 0)
        # value blocks [hk, d, PAGE] (attention.kv_layout): V^T [HEAD_DIM, BLOCK_N] in runs of PAGE tokens
        v_off = (page * (PAGE * NUM_KV_HEADS * HEAD_DIM) + kvh * (HEAD_DIM * PAGE) + toks % PAGE)[None, :] \
            + d[:, None] * PAGE
        # runs of PAGE tokens from multiples of PAGE: the compiler cannot see through the block table's load
        v_t = tl.load(cache_ptr + plane_stride + tl.max_contiguous(tl.multiple_of(v_off, [PAGE, PAGE]), [1, PAGE]))
        acc_t = acc_t * alpha[None, :] + tl.dot(v_t, (p_t * 256.0).to(tl.float8e4nv))
        m = m_new
    acc_t = acc_t * (v_scale / 256.0)
    if DIRECT:
        if HAS_SINKS:
            acc, l = _fold_sinks(tl.trans(acc_t), m, l, sinks_ptr, heads, gmask)
            acc_t = tl.trans(acc)
        out_t = acc_t / tl.maximum(l, 1e-30)[None, :]
        tl.store(out_ptr + b * out_stride_t + heads[None, :] * out_stride_h + d[:, None],
                 out_t.to(out_ptr.dtype.element_ty), mask=gmask[None, :])
        return
    row = (b * NUM_HEADS + heads) * num_splits + split
    tl.store(part_acc_ptr + row[None, :] * HEAD_DIM + d[:, None], acc_t, mask=gmask[None, :])
    tl.store(part_ml_ptr + row * 2, m, mask=gmask)
    tl.store(part_ml_ptr + row * 2 + 1, l, mask=gmask)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, out_stride_t, out_stride_h, num_splits,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                         S_PAD: tl.constexpr, sinks_ptr=None, HAS_SINKS: tl.constexpr = False):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    smask = s < num_splits
    row = (b * NUM_HEADS + h) * num_splits + s
    m = tl.load(part_ml_ptr + row * 2, mask=smask, other=float("-inf"))
    l = tl.load(part_ml_ptr + row * 2 + 1, mask=smask, other=0.0)
    m_max = tl.max(m, 0)
    if HAS_SINKS:  # the head's sink logit joins the denominator (as _fold_sinks)
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # empty sequence (a padded graph row)
    w = tl.exp2(m - m_max)
    acc = tl.load(part_acc_ptr + row[:, None] * D_PAD + d[None, :], mask=smask[:, None], other=0.0)
    total = tl.sum(l * w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_max)
    out = tl.sum(acc * w[:, None], 0) / tl.maximum(total, 1e-30)
    tl.store(out_ptr + b * out_stride_t + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def _tile(block_n: int, kv_cache: torch.Tensor) -> int:
    """A loop tile of block_n tokens, checked: value blocks that keep tokens innermost are read a page at a time."""
    page = kv_cache.shape[2]
    if values_tokens_inner(kv_cache) and block_n % page:
        raise ValueError(f"a tile of {block_n} tokens over an FP8 cache must be a multiple of its {page}-token blocks")
    return block_n


def decode_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many context splits keep ~4 programs per SM busy without splits shorter than 256 tokens."""
    want = triton.cdiv(4 * num_sms, batch * num_kv_heads)
    return max(1, min(want, triton.cdiv(max_seq_len, 256), 64))


def decode_stages(kv_cache: torch.Tensor) -> int:
    """Software-pipelining depth of the decode loop: 3 over an FP8 cache, whose 64-token tiles are half a bf16
    tile's bytes (faster in scripts/dev/tune_decode.py's sweep, the same output bit for bit); 2 elsewhere."""
    return 3 if kv_cache.dtype == torch.float8_e4m3fn else 2


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 scale: float, num_splits: int, out: torch.Tensor | None = None, *, block_n: int | None = None,
                 num_warps: int = 4, num_stages: int | None = None, maxnreg: int | None = None,
                 k_scale: float = 1.0, v_scale: float = 1.0, use_fp8_dots: bool | None = None,
                 window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, d] -> out [B, H, d]; one new token per sequence whose KV is already in the cache.

    window: a sliding window of that many tokens (the query's own included; 0: the whole context), whose block
    table entries before it are never read. sinks: [H] learned logits that join each head's softmax denominator.

    block_n / num_warps / num_stages / maxnreg: launch configuration (scripts/dev/tune_decode.py sweeps them;
    num_stages None: decode_stages(kv_cache); maxnreg None: ptxas's choice; a register cap lets more
    programs share an SM: scripts/dev/decode_kernel_resources.py shows registers and spills without a GPU).
    k_scale / v_scale: an FP8 cache's per-layer scales (ignored for other caches). use_fp8_dots: run
    _decode_fp8_dots_kernel (None: where fp8_dots says; the tests force it on the CPU interpreter)."""
    b, num_heads, d = q.shape
    _, _, page, hk, _ = kv_cache.shape
    _check_cache(kv_cache, hk, d)
    qk_scale, scale_v = _kv_scales(kv_cache, scale, k_scale, v_scale)
    group = num_heads // hk
    d_pad = triton.next_power_of_2(d)
    out = torch.empty_like(q) if out is None else out
    direct = num_splits == 1  # no partials to merge: the kernel writes the output itself
    part_acc = torch.empty((b, num_heads, 1 if direct else num_splits, d_pad), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((b, num_heads, 1 if direct else num_splits, 2), dtype=torch.float32, device=q.device)
    attn_kw = dict(sinks_ptr=sinks, WINDOW=window, HAS_SINKS=sinks is not None)
    if fp8_dots(q, kv_cache) if use_fp8_dots is None else use_fp8_dots:
        _decode_fp8_dots_kernel[(b, hk, num_splits)](
            q, kv_cache, block_tables, seq_lens, part_acc, part_ml, out, qk_scale, v_scale,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), kv_cache.stride(0),
            num_splits, NUM_HEADS=num_heads, NUM_KV_HEADS=hk, GROUP=group,
            G_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d, PAGE=page, BLOCK_N=_tile(block_n or 64, kv_cache),
            DIRECT=direct, num_warps=num_warps, num_stages=num_stages or 2, **attn_kw,
            **({} if maxnreg is None else {"maxnreg": maxnreg}))
    else:
        _decode_split_kernel[(b, hk, num_splits)](
            q, kv_cache, block_tables, seq_lens, part_acc, part_ml, out, qk_scale, v_scale,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), kv_cache.stride(0),
            num_splits,
            NUM_HEADS=num_heads, NUM_KV_HEADS=hk, GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=d, D_PAD=d_pad, PAGE=page, BLOCK_N=_tile(block_n or (64 if d_pad <= 128 else 32), kv_cache),
            IEEE=q.dtype == torch.float32, DIRECT=direct, SCALE_V=scale_v, F16_DOTS=_f16_dots(q, kv_cache),
            V_TOKENS_INNER=values_tokens_inner(kv_cache), **attn_kw,
            num_warps=num_warps, num_stages=num_stages or decode_stages(kv_cache),
            **({} if maxnreg is None else {"maxnreg": maxnreg}))
    if direct:
        return out
    _merge_splits_kernel[(b, num_heads)](
        part_acc, part_ml, out, out.stride(0), out.stride(1), num_splits,
        NUM_HEADS=num_heads, HEAD_DIM=d, D_PAD=d_pad, S_PAD=max(2, triton.next_power_of_2(num_splits)),
        sinks_ptr=sinks, HAS_SINKS=sinks is not None, num_warps=1 if d_pad <= 64 else 2)
    return out


# The per-sequence arrays are read one scalar at a time, so their alignment buys nothing; a mixed step passes them
# from its first prompt row on (after the decodes), at whatever 4-byte offset that is: unspecialised, one compiled
# kernel serves every decode count.
@triton.jit(do_not_specialize=["bt_stride"],
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_ptr"])
def _prefill_kernel(q_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr, out_ptr,
                    qk_scale, v_scale, q_stride_t, q_stride_h, out_stride_t, out_stride_h, bt_stride, plane_stride,
                    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                    D_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    IEEE: tl.constexpr, SCALE_V: tl.constexpr, F16_DOTS: tl.constexpr = False,
                    V_TOKENS_INNER: tl.constexpr = False, sinks_ptr=None, WINDOW: tl.constexpr = 0,
                    HAS_SINKS: tl.constexpr = False):
    q_block = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    if q_block * BLOCK_M < q_len:
        seq_len = tl.load(seq_lens_ptr + b)
        ctx = seq_len - q_len  # tokens cached before this chunk
        kvh = h // GROUP
        rows = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < q_len
        d = tl.arange(0, D_PAD)
        dmask = d < HEAD_DIM
        q = tl.load(q_ptr + (q_start + rows)[:, None].to(tl.int64) * q_stride_t + h * q_stride_h + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        if F16_DOTS:
            q, qk_scale = _f16_queries(q, qk_scale)
        q_pos = ctx + rows
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        bt_row = block_tables_ptr + b.to(tl.int64) * bt_stride
        end = tl.minimum(seq_len, ctx + (q_block + 1) * BLOCK_M)
        # A sliding window: from the page where the first row's window starts (pages before it may be freed).
        lo = _window_start(ctx + q_block * BLOCK_M, WINDOW)
        for start in range(lo // PAGE * PAGE, end, BLOCK_N):
            toks = start + tl.arange(0, BLOCK_N)
            valid = (toks < end) & (toks >= lo)
            causal = valid[None, :] & (toks[None, :] <= q_pos[:, None])
            if WINDOW > 0:
                causal = causal & (toks[None, :] > q_pos[:, None] - WINDOW)
            acc, m, l = _attend_tile(q, acc, m, l, cache_ptr, bt_row, start, end, toks, valid, causal, d, dmask,
                                     kvh, qk_scale, plane_stride, HEAD_DIM, NUM_KV_HEADS, PAGE, IEEE, BLOCK_N,
                                     V_TOKENS_INNER)
        if SCALE_V:
            acc = acc * v_scale
        if HAS_SINKS:
            acc, l = _fold_sinks(acc, m, l, sinks_ptr, h + rows * 0, rmask)
        out = acc / tl.maximum(l, 1e-30)[:, None]
        tl.store(out_ptr + (q_start + rows)[:, None].to(tl.int64) * out_stride_t + h * out_stride_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def paged_prefill(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  query_start_loc: torch.Tensor, max_query_len: int, scale: float,
                  out: torch.Tensor | None = None, *, k_scale: float = 1.0, v_scale: float = 1.0, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, d] (sequences' new tokens back to back) -> out [T, H, d], causal over the paged context.

    window, sinks: as paged_decode's (a query sees the window's tokens up to itself)."""
    t, num_heads, d = q.shape
    _, _, page, hk, _ = kv_cache.shape
    _check_cache(kv_cache, hk, d)
    qk_scale, scale_v = _kv_scales(kv_cache, scale, k_scale, v_scale)
    num_seqs = seq_lens.shape[0]
    d_pad = triton.next_power_of_2(d)
    out = torch.empty_like(q) if out is None else out
    block_m = 64 if max_query_len > 16 else 16
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        q, kv_cache, block_tables, seq_lens, query_start_loc, out, qk_scale, v_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0), kv_cache.stride(0),
        NUM_KV_HEADS=hk, GROUP=num_heads // hk, HEAD_DIM=d, D_PAD=d_pad, PAGE=page, BLOCK_M=block_m,
        BLOCK_N=_tile(64 if d_pad <= 128 else 32, kv_cache), IEEE=q.dtype == torch.float32, SCALE_V=scale_v,
        F16_DOTS=_f16_dots(q, kv_cache), V_TOKENS_INNER=values_tokens_inner(kv_cache), sinks_ptr=sinks, WINDOW=window,
        HAS_SINKS=sinks is not None, num_warps=4, num_stages=2)
    return out
