"""A model-sized random-weight checkpoint on local disk, and control of its files' page-cache state.

Start-up benchmarks load a real safetensors checkpoint, as production does, but no weights travel to the
benchmark machine: the named shape's checkpoint is written there with seeded random weights (made on
the GPU where there is one: a 7B shape's 15 GB in seconds), in ~4 GB shards as hub checkpoints come, with
the embedded byte-level tokenizer. Whether the first read of those files comes from disk or from the page
cache decides what a load measures, so the benchmark sets that state deliberately and measures it (mincore).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SHARD_BYTES = 4 * 10**9
PAGE_CACHE_MODES = ("warm", "drop", "as-is")  # read once before the runs, dropped before each, left alone
_READ_CHUNK = 64 * 2**20


@dataclass
class CheckpointWritten:
    path: str
    bytes: int
    files: int
    seconds: float

    def as_dict(self) -> dict:
        return {**asdict(self), "gb_per_s": round(self.bytes / self.seconds / 1e9, 3) if self.seconds else None}


def write_random_checkpoint(config: dict, path: Path, seed: int = 0, std: float = 0.02,
                            shard_bytes: int = SHARD_BYTES, device: str | None = None) -> CheckpointWritten:
    """Write an HF checkpoint of `config` (an HF config dict) with seeded random weights in its torch_dtype:
    config.json, model-0000k-of-0000n.safetensors + index, and the embedded byte-level tokenizer."""
    import torch
    from safetensors.torch import save_file

    from railyard.engine.startup.tiny_model import weight_shapes, write_tokenizer

    start = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, config.get("torch_dtype") or "float32")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator(device=dev).manual_seed(seed)
    shards: list[dict] = [{}]
    size = 0
    for name, shape in weight_shapes(config).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=dtype)
        else:
            t = (torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * std).to(dtype).cpu()
        if size and size + t.numel() * t.element_size() > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    weight_map, total = {}, 0
    for k, part in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
        shards[k] = {}  # free the shard's host copy
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    write_tokenizer(path)
    (path / "config.json").write_text(json.dumps(config, indent=1))  # last: a directory with it is complete
    return CheckpointWritten(str(path), total, len(shards), time.perf_counter() - start)


def checkpoint_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def read_through(files: list[Path]) -> dict:
    """Read the files once (into the page cache); returns bytes, seconds and GB/s of that read."""
    start, total = time.perf_counter(), 0
    buf = bytearray(_READ_CHUNK)
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    seconds = time.perf_counter() - start
    return {"bytes": total, "seconds": round(seconds, 3),
            "gb_per_s": round(total / seconds / 1e9, 3) if seconds else None}


def drop_from_page_cache(files: list[Path]) -> None:
    """Write the files' pages back and ask the kernel to forget them, so the next read comes from disk."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(files: list[Path]) -> float | None:
    """The fraction of the files' pages in the page cache now (mincore(2)); None where it cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    resident = pages = 0
    for file in files:
        size = file.stat().st_size
        if size == 0:
            continue
        n = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * n)()
        fd = os.open(file, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                if libc.mincore(addr, size, vec) != 0:
                    return None
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        resident += sum(b & 1 for b in bytes(vec))
        pages += n
    return resident / pages if pages else None
