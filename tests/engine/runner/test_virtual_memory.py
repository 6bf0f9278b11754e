"""A VirtualMemoryPool gives its physical memory back and takes it again at the same addresses, so a CUDA graph that
reads its tensors replays correctly after a release and a restore (sleep mode's wake-up without recapture). GPU only:
the pool is CUDA's virtual memory management."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA virtual memory management needs a GPU")


def test_a_graph_over_pool_tensors_replays_the_same_after_release_and_restore():
    from railyard.engine.runner.virtual_memory import VirtualMemoryPool

    dev = torch.device("cuda")
    pool = VirtualMemoryPool("test")
    with pool.allocating(dev):
        w = torch.randn(1024, 1024, device=dev)
        bulk = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    x, out = torch.randn(8, 1024, device=dev), torch.empty(8, 1024, device=dev)
    out.copy_(x @ w)  # kernels loaded outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(x @ w)
    graph.replay()
    torch.cuda.synchronize()
    expected, host, address = out.clone(), w.cpu(), w.data_ptr()
    assert pool.contains(w) and pool.contains(bulk) and not pool.contains(x)

    free_awake = torch.cuda.mem_get_info()[0]
    pool.release()
    assert pool.released and pool.mapped_bytes == 0
    assert torch.cuda.mem_get_info()[0] - free_awake >= bulk.numel() + w.numel() * 4

    pool.restore()
    assert pool.mapped_bytes == pool.reserved_bytes and w.data_ptr() == address
    w.copy_(host)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_pools_outlive_their_owners_and_keep_what_they_mapped():
    """torch calls a pool's callbacks as long as its MemPool holds segments: a pool whose owner let go of it stays,
    its tensors' memory freed into it and kept mapped (torch's empty_cache does not hand back a live MemPool's
    cache), and a later pool allocates beside it."""
    import gc
    import weakref

    from railyard.engine.runner.virtual_memory import VirtualMemoryPool

    dev = torch.device("cuda")
    first = VirtualMemoryPool("first")
    with first.allocating(dev):
        t = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    mapped = first.mapped_bytes
    assert mapped >= 64 << 20
    ref = weakref.ref(first)
    del t, first
    gc.collect()
    torch.cuda.empty_cache()
    assert ref() is not None and ref().mapped_bytes == mapped
    second = VirtualMemoryPool("second")
    with second.allocating(dev):
        u = torch.ones(1 << 20, device=dev)
    assert second.contains(u) and not ref().contains(u) and u.sum().item() == 1 << 20
