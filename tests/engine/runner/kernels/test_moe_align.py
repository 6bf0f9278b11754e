"""The expert-sorted, block-padded slot list the fused-MoE GEMMs read (kernels/moe_align.py), from one block for a
small decode step's slots and from three launches past ONE_PROGRAM_SLOTS: the same list either way, and shapes that
depend on the token count only, whatever the routing (what lets it run inside CUDA graphs). On the GPU when there
is one, else in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from railyard.engine.runner.kernels import moe_align  # noqa: E402
from railyard.engine.runner.kernels.moe_align import align_by_expert  # noqa: E402
from railyard.engine.runner.layers.moe import route_softmax_topk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PATHS = {"one_program": 4096, "three_launches": 0}  # the bounds each path takes every case under


def _routing(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return route_softmax_topk(torch.randn(tokens, experts, generator=gen) * 2, top_k, True)[1]


def _align_by_hand(ids: torch.Tensor, experts: int, block: int) -> list[int]:
    """The definition: each expert's slots in order, padded with the sentinel to a multiple of block."""
    flat, out = ids.reshape(-1).tolist(), []
    for e in range(experts):
        run = [s for s, x in enumerate(flat) if x == e]
        out += run + [len(flat)] * (-len(run) % block)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("tokens", "experts", "top_k", "block"), [(1, 8, 2, 16), (37, 8, 2, 16), (70, 16, 4, 64),
                                                                      (5, 128, 8, 16), (300, 128, 8, 64),
                                                                      (100, 60, 4, 32)])
def test_slots_are_grouped_by_expert_and_each_run_padded_to_whole_blocks(tokens, experts, top_k, block, path,
                                                                         monkeypatch):
    monkeypatch.setattr(moe_align, "ONE_PROGRAM_SLOTS", PATHS[path])
    ids = _routing(tokens, experts, top_k, seed=tokens)
    sorted_slots, block_experts, padded_len = align_by_expert(ids.to(DEVICE), experts, block)
    want = _align_by_hand(ids, experts, block)
    assert padded_len.item() == len(want)
    assert sorted_slots[:len(want)].tolist() == want
    assert (sorted_slots[len(want):] == tokens * top_k).all()  # the rest: sentinels
    flat = ids.reshape(-1)
    for b in range(len(want) // block):
        real = [s for s in want[b * block:(b + 1) * block] if s < len(flat)]
        assert real and all(flat[s] == block_experts[b].item() for s in real)
    assert (block_experts[len(want) // block:] == experts - 1).all()  # blocks past the end: the last expert's


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block"), [(512, 32, 4, 64), (256, 128, 8, 32),
                                                                      (3, 60, 4, 16), (500, 16, 8, 64)])
def test_one_program_and_three_launches_write_the_same_list(tokens, experts, top_k, block, monkeypatch):
    """Spread and skewed routings (every slot but a few on the first experts, experts left empty between), up to
    4,000 slots, past the engine's one-program bound."""
    spread = _routing(tokens, experts, top_k, seed=tokens + experts)
    skewed = torch.stack([torch.arange(top_k)] * tokens)
    skewed[::7, -1] = experts - 1
    for ids in (spread, skewed):
        outputs = {}
        for path, bound in PATHS.items():
            monkeypatch.setattr(moe_align, "ONE_PROGRAM_SLOTS", bound)
            outputs[path] = [t.cpu() for t in align_by_expert(ids.to(DEVICE), experts, block)]
        for one, three in zip(outputs["one_program"], outputs["three_launches"], strict=True):
            assert torch.equal(one, three)


def test_the_slot_lists_shapes_depend_on_the_token_count_only():
    """Two routings of the same 24 tokens, one spread over all experts and one onto a single expert, give tensors of
    the same shapes: a CUDA graph captured with one replays the other."""
    spread = torch.arange(48).reshape(24, 2) % 16
    same = torch.zeros(24, 2, dtype=torch.int64)
    same[:, 1] = 1
    a, b = align_by_expert(spread.to(DEVICE), 16, 16), align_by_expert(same.to(DEVICE), 16, 16)
    assert [t.shape for t in a] == [t.shape for t in b]
    assert a[2].item() == 16 * 16 and b[2].item() == 2 * 32  # 48 slots: 16 experts x 3 -> 16 rows each; 2 x 24 -> 32
