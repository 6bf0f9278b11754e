"""The batched LoRA kernels compute what the torch reference computes, for any mix of adapter slots and
base-model tokens, fused projections' parts and ranks; base-model rows are never touched.

GPU when there is one, else Triton's CPU interpreter; skipped where triton is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import lora as kernels  # noqa: E402
from railyard.engine.runner.layers.lora import LoRABatch, reference_lora  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(slots: list[int], num_slots: int, parts: list[int], rank: int, hidden: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    t = len(slots)
    x = torch.randn(t, hidden, generator=gen).to(DEVICE)
    a = torch.randn(num_slots, len(parts) * rank, hidden, generator=gen).to(DEVICE) / hidden ** 0.5
    b = torch.randn(num_slots, sum(parts), rank, generator=gen).to(DEVICE)
    y = torch.randn(t, sum(parts), generator=gen).to(DEVICE)
    batch = LoRABatch(num_slots, max_tokens=t + 5, device=DEVICE)
    batch.stage(np.array(slots, dtype=np.int32))
    batch.prepare(t)
    offsets = np.cumsum([0, *parts]).tolist()
    return x, a, b, y, batch, offsets


def _kernels(x, a, b, y, batch, offsets, rank):
    out = y.clone()
    shrunk = kernels.shrink(x, a, batch.order, batch.counts, batch.starts)
    part_offsets = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
    kernels.expand(shrunk, b, out, batch.order, batch.counts, batch.starts, part_offsets,
                   int(max(np.diff(offsets))), rank, parts_aligned=all(o % 8 == 0 for o in offsets))
    return out


CASES = {
    "decode-mixed-adapters-and-base": ([0, -1, 2, 0, 1, -1, 2, 2], 3, [48], 16, 64),
    "fused-qkv-parts": ([1, 1, 0, -1, 1, 0, 0, 0, 1, -1, 0], 2, [64, 32, 32], 16, 64),
    "gate-up-rank-32": ([0] * 20 + [1] * 7 + [-1] * 3, 2, [96, 96], 32, 80),
    "prefill-many-tokens-split-k-off": ([i % 3 - 1 for i in range(300)], 2, [40], 16, 48),
    "decode-long-k-split-over-programs": ([1, 0, -1, 1], 2, [24], 16, 600),
    "an-empty-slot-between-busy-ones": ([0, 0, 2, 3, -1, 3, 0] * 5, 4, [32], 16, 48),
    "only-base-tokens": ([-1, -1, -1], 2, [32], 16, 32),
    "parts-longer-than-a-programs-column-tiles": ([0, 1, -1, 1, 0, 0], 2, [640, 128, 128], 16, 64),
    "prefill-parts-over-several-programs": ([i % 3 - 1 for i in range(300)], 2, [400, 72], 16, 48),
    "parts-off-the-vector-width": ([0, 1, 1, -1, 0], 2, [36, 20, 20], 16, 40),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shrink_and_expand_match_the_torch_reference(case):
    slots, num_slots, parts, rank, hidden = CASES[case]
    x, a, b, y, batch, offsets = _case(slots, num_slots, parts, rank, hidden)
    want = reference_lora(x, y.clone(), a, b, batch, offsets, rank)
    got = _kernels(x, a, b, y, batch, offsets, rank)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_base_model_rows_stay_exactly_as_they_were():
    slots, num_slots, parts, rank, hidden = CASES["fused-qkv-parts"]
    x, a, b, y, batch, offsets = _case(slots, num_slots, parts, rank, hidden)
    got = _kernels(x, a, b, y, batch, offsets, rank)
    base = torch.tensor([s < 0 for s in slots], device=DEVICE)
    assert torch.equal(got[base], y[base])
    assert not torch.allclose(got[~base], y[~base])


def test_the_reference_is_each_tokens_own_adapter_applied_alone():
    slots, num_slots, parts, rank, hidden = CASES["fused-qkv-parts"]
    x, a, b, y, batch, offsets = _case(slots, num_slots, parts, rank, hidden)
    got = reference_lora(x, y.clone(), a, b, batch, offsets, rank)
    for t, s in enumerate(slots):
        want = y[t].clone()
        if s >= 0:
            for i in range(len(parts)):
                lo, hi = offsets[i], offsets[i + 1]
                want[lo:hi] += x[t] @ a[s, i * rank:(i + 1) * rank].T @ b[s, lo:hi].T
        torch.testing.assert_close(got[t], want, rtol=1e-4, atol=1e-4)


def test_restaging_a_shorter_step_leaves_the_rows_past_it_to_the_base_model():
    batch = LoRABatch(2, max_tokens=8, device=DEVICE)
    batch.stage(np.array([0, 1, 1, 0, 1], dtype=np.int32))
    batch.stage(np.array([1, 0], dtype=np.int32))
    batch.prepare(6)  # a padded bucket of 6 rows: rows 2..5 are padding
    assert batch.token_slots[:6].tolist() == [1, 0, -1, -1, -1, -1]
    assert batch.counts.tolist() == [1, 1, 4]
    assert batch.order[:2].tolist() == [1, 0]


def test_split_k_steps_add_into_the_workspace_zeroed_once_per_forward_pass():
    """Two layers share the batch's workspace (a column block each); each forward pass's prepare zeroes it, so a
    second step over the same buffers gives the reference again instead of adding to the first step's sums."""
    slots, num_slots, parts, rank, hidden = CASES["decode-long-k-split-over-programs"]
    x, a, b, y, _, offsets = _case(slots, num_slots, parts, rank, hidden)
    batch = LoRABatch(num_slots, max_tokens=len(slots) + 5, device=DEVICE)
    first_layer, second_layer = batch.reserve(len(parts) * rank), batch.reserve(len(parts) * rank)
    batch.allocate()
    part_offsets = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
    for step in range(2):
        batch.stage(np.array(slots, dtype=np.int32))
        batch.prepare(len(slots))
        for first in (first_layer, second_layer):
            out = batch.shrink_out(first, len(parts) * rank, len(slots))
            got = y.clone()
            shrunk = kernels.shrink(x, a, batch.order, batch.counts, batch.starts, out)
            assert shrunk.data_ptr() == out.data_ptr()  # the kernel wrote into the workspace
            kernels.expand(shrunk, b, got, batch.order, batch.counts, batch.starts, part_offsets,
                           int(max(np.diff(offsets))), rank)
            torch.testing.assert_close(got, reference_lora(x, y.clone(), a, b, batch, offsets, rank),
                                       rtol=1e-4, atol=1e-4)


def test_steps_too_long_to_split_get_no_workspace():
    batch = LoRABatch(2, max_tokens=1024, device=DEVICE)
    first = batch.reserve(32)
    batch.allocate()
    assert batch.workspace.shape == (256, 32)
    assert batch.shrink_out(first, 32, 256).shape == (256, 32)
    assert batch.shrink_out(first, 32, 257) is None


GATE_UP_CASES = {
    "gate-up-rank-32": CASES["gate-up-rank-32"],
    "decode-adapters-and-base-mixed": ([1, -1, 0, 0, -1, 2, 1], 3, [40, 40], 16, 48),
    "prefill-over-several-programs": ([i % 3 - 1 for i in range(300)], 2, [600, 600], 16, 48),
    "only-base-tokens": ([-1, -1, -1, -1], 2, [64, 64], 16, 32),
}


@pytest.mark.parametrize("case", list(GATE_UP_CASES))
def test_expand_fused_with_silu_and_mul_gives_expand_then_the_activation_kernel(case):
    """The gate/up projection's expand and its SiLU-and-mul in one kernel: every row (base-model rows too) equals
    the in-place expand followed by the SiLU-and-mul kernel, bit for bit (the same roundings in the same order)."""
    from railyard.engine.runner.kernels import fused

    slots, num_slots, parts, rank, hidden = GATE_UP_CASES[case]
    x, a, b, y, batch, offsets = _case(slots, num_slots, parts, rank, hidden)
    y, b = y.to(torch.bfloat16), b.to(torch.bfloat16)
    shrunk = kernels.shrink(x, a, batch.order, batch.counts, batch.starts)
    got = kernels.expand_silu_and_mul(shrunk, b, y, batch.order, batch.counts, batch.starts, rank)
    assert got.shape == (len(slots), parts[0]) and got.dtype == torch.bfloat16
    assert torch.equal(got, fused.silu_and_mul(_kernels(x, a, b, y, batch, offsets, rank)))
    base = torch.tensor([s < 0 for s in slots], device=DEVICE)
    assert torch.equal(got[base], fused.silu_and_mul(y[base]))  # base rows: y's own activation
