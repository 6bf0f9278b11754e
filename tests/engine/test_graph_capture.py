"""Capture without torch's per-graph cache flushes: inside the context the flushes do nothing, outside they are
torch's own again (also after an exception), so nothing else in the process loses them."""

from __future__ import annotations

import gc

import pytest
import torch

from railyard.engine.graph_capture import without_cache_flushes


def test_the_flushes_do_nothing_inside_and_are_torchs_again_outside():
    empty_cache, collect = torch.cuda.empty_cache, gc.collect
    with without_cache_flushes():
        assert torch.cuda.empty_cache is not empty_cache and gc.collect is not collect
        assert torch.cuda.empty_cache() is None and gc.collect() is None
    assert torch.cuda.empty_cache is empty_cache and gc.collect is collect


def test_an_exception_inside_restores_the_flushes():
    empty_cache, collect = torch.cuda.empty_cache, gc.collect
    with pytest.raises(RuntimeError, match="capture failed"):
        with without_cache_flushes():
            raise RuntimeError("capture failed")
    assert torch.cuda.empty_cache is empty_cache and gc.collect is collect
