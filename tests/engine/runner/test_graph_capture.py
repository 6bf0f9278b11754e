"""Capture without an eager warm-up before every capture: only the first size, and a size whose guarded capture met a
kernel not loaded yet, get one."""

from __future__ import annotations

import gc

import pytest
import torch

from railyard.engine.runner import graph_capture
from railyard.engine.runner.graph_capture import NeedsWarmUp, capture_each, jit_forbidden


# -- warm-ups only where a capture needs one ------------------------------------------------------------------
class _Recorder:
    """warm_up / capture callbacks that log what ran; capture raises NeedsWarmUp for the sizes in `cold` until
    they are warmed up (as a Triton kernel not loaded yet would)."""

    def __init__(self, cold: set[int] = frozenset()) -> None:
        self.cold = set(cold)
        self.calls: list[tuple[str, int]] = []
        self.kept: dict[int, str] = {}

    def warm_up(self, n: int) -> None:
        self.calls.append(("warm", n))
        self.cold.discard(n)

    def capture(self, n: int) -> None:
        self.calls.append(("capture", n))
        if n in self.cold:
            raise NeedsWarmUp(f"size {n}")
        self.kept[n] = "graph"


def test_only_the_first_size_is_warmed_up_when_no_capture_meets_a_new_kernel():
    rec = _Recorder()
    warmed = capture_each([64, 32, 16], rec.warm_up, rec.capture)
    assert warmed == [64]
    assert rec.calls == [("warm", 64), ("capture", 64), ("capture", 32), ("capture", 16)]
    assert set(rec.kept) == {64, 32, 16}


def test_a_capture_that_needs_a_kernel_is_warmed_up_and_captured_again():
    rec = _Recorder(cold={8})
    warmed = capture_each([16, 8, 4], rec.warm_up, rec.capture)
    assert warmed == [16, 8]
    assert rec.calls == [("warm", 16), ("capture", 16), ("capture", 8), ("warm", 8), ("capture", 8),
                         ("capture", 4)]
    assert set(rec.kept) == {16, 8, 4}


def test_other_errors_of_a_capture_are_not_taken_for_a_missing_warm_up():
    def capture(n: int) -> None:
        raise ValueError("a real capture failure")

    with pytest.raises(ValueError, match="real capture failure"):
        capture_each([32, 16], lambda n: None, capture)


def test_the_second_capture_of_a_size_runs_unguarded():
    """After its warm-up a size is captured as every size was before: a kernel Triton still wants to load then
    loads (under capture), it does not fail the start."""
    knobs = pytest.importorskip("triton").knobs
    held = knobs.runtime.jit_cache_hook  # another's (jit_watch's, once an engine was ready) or none
    guarded: list[bool] = []

    def capture(n: int) -> None:
        guarded.append(knobs.runtime.jit_cache_hook is not held)
        if len(guarded) == 2:
            raise NeedsWarmUp("first guarded capture")

    capture_each([32, 16], lambda n: None, capture)
    assert guarded == [False, True, False]


def test_under_capture_a_triton_cache_miss_raises_elsewhere_the_held_hook_answers(monkeypatch):
    """The hook is process-wide, but only the capturing thread is refused: a weight load on another thread may
    compile its kernels (through the start-up timer's hook, restored on exit, also after an exception)."""
    runtime = pytest.importorskip("triton").knobs.runtime
    held_calls: list[dict] = []

    def held(**kwargs):
        held_calls.append(kwargs)
        return False

    runtime.jit_cache_hook = held
    try:
        with jit_forbidden():
            monkeypatch.setattr(graph_capture, "capturing", lambda: True)
            with pytest.raises(NeedsWarmUp):
                runtime.jit_cache_hook(key="k", is_warmup=False)
            assert held_calls == []
            monkeypatch.setattr(graph_capture, "capturing", lambda: False)
            assert runtime.jit_cache_hook(key="k", is_warmup=False) is False
            assert held_calls == [{"key": "k", "is_warmup": False}]
        assert runtime.jit_cache_hook is held
        with pytest.raises(ValueError):
            with jit_forbidden():
                raise ValueError("capture failed")
        assert runtime.jit_cache_hook is held
    finally:
        runtime.jit_cache_hook = None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_the_fp8_gemm_autotuner_refuses_to_time_under_capture():
    from railyard.engine.runner.kernels.fp8_gemm import _quick_bench

    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with pytest.raises(NeedsWarmUp):
        with torch.cuda.graph(graph):
            x.add_(1)
            _quick_bench(lambda: None, None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_a_unit_scale_first_asked_for_under_capture_asks_for_a_warm_up():
    """The unscaled FP8 GEMM's 1.0 made under capture would hold its value only once the graph replays."""
    from railyard.engine.runner.layers import fp8

    fp8._UNIT_SCALES.clear()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(NeedsWarmUp, match="unit_scale"):
        with torch.cuda.graph(graph):
            fp8.unit_scale(torch.device("cuda"))
    assert fp8.unit_scale(torch.device("cuda")).item() == 1.0
