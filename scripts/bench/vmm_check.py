"""On a GPU: a CUDA graph that reads tensors of a VirtualMemoryPool replays correctly after the pool's physical
memory was released and restored at the same addresses, the release gives the memory back to the device, and
how long release and restore take for SIZE_GB of tensors (default 15, a 7B model's weights). Prints JSON."""

from __future__ import annotations

import json
import os
import time

import torch

from railyard.engine.runner.virtual_memory import VirtualMemoryPool


def main() -> None:
    dev = torch.device("cuda")
    size_gb = float(os.environ.get("SIZE_GB", "15"))
    pool = VirtualMemoryPool("check")
    with pool.allocating(dev):
        w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        bulk = [torch.empty(64 << 20, dtype=torch.uint8, device=dev) for _ in range(int(size_gb * 16))]
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    out = torch.empty(64, 4096, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out.copy_(x @ w + 1)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        out.copy_(x @ w + 1)
    graph.replay()
    expected = (x @ w + 1).clone()
    torch.cuda.synchronize()
    before = out.clone()
    host = w.to("cpu", copy=True).pin_memory()
    addr = w.data_ptr()
    free_awake = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    pool.release()
    release_s = time.perf_counter() - t0
    free_asleep = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    pool.restore()
    restore_s = time.perf_counter() - t0
    w.copy_(host, non_blocking=True)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    result = {
        "segments": len(pool._segments), "reserved_gb": round(pool.reserved_bytes / 2**30, 2),
        "freed_by_release_gb": round((free_asleep - free_awake) / 2**30, 2),
        "release_s": round(release_s, 4), "restore_s": round(restore_s, 4),
        "same_address": w.data_ptr() == addr, "graph_output_equal": bool(torch.equal(out, before)),
        "matches_eager": bool(torch.equal(out, expected)),
        "memory_reserved_gb": round(torch.cuda.memory_reserved() / 2**30, 2),
    }
    del bulk
    print(json.dumps(result))


if __name__ == "__main__":
    main()
