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


def test_freeing_the_pool_tensors_returns_their_address_ranges():
    from railyard.engine.runner.virtual_memory import VirtualMemoryPool

    dev = torch.device("cuda")
    pool = VirtualMemoryPool("test")
    with pool.allocating(dev):
        t = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    assert pool.reserved_bytes >= 64 << 20
    del t
    torch.cuda.empty_cache()
    assert pool.reserved_bytes == 0
