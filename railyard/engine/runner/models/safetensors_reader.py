"""Read safetensors files for the model's device, two ways, and time what the reading takes.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
offsets) and the tensors' bytes. Two readers:

- mapped (the default): safetensors' own `get_tensor` on the memory-mapped file, a CPU tensor that the loader
  copies into its parameter (to a GPU from pageable memory); the faster of the two from the page cache
  (docs/architecture.md).
- staged ($RAILYARD_WEIGHTS_READER=staged): the bytes go from the file into two pinned buffers in large
  chunks, and from those to the device while the next chunk is read. Slower from the page cache; kept for files
  that are not in it, where large sequential reads may beat the mapped path's page faults
  (scripts/dev/load_paths.py measures both).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from railyard.errors import ConfigError, ModelLoadError

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
           "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
CHUNK_BYTES = 64 * 2**20  # per staging buffer: large reads, yet little pinned memory
READERS = ("mapped", "staged")
READER_ENV = "RAILYARD_WEIGHTS_READER"


def default_staged() -> bool:
    """Whether the loader reads through the pinned chunks: $RAILYARD_WEIGHTS_READER (mapped, the default, or
    staged)."""
    name = os.environ.get(READER_ENV, "mapped").strip().lower() or "mapped"
    if name not in READERS:
        raise ConfigError(f"${READER_ENV} must be one of {', '.join(READERS)}, got {name!r}")
    return name == "staged"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes lie (absolute file offsets)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> list[TensorEntry]:
    """The file's tensors in file order, checked against the file's size and their dtypes and shapes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path} is not a safetensors file (shorter than its header length)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise ModelLoadError(f"{path} is not a safetensors file (its header length exceeds the file)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{path}: malformed safetensors header: {exc}") from None
    base, entries = 8 + n, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: tensor {name!r} has an unsupported or malformed entry ({exc})") from None
        if not 0 <= begin <= end or base + end > size or end - begin != math.prod(shape) * dtype.itemsize:
            raise ModelLoadError(f"{path}: tensor {name!r} lies outside the file or does not match its shape")
        entries.append(TensorEntry(name, dtype, shape, base + begin, base + end))
    return sorted(entries, key=lambda e: e.start)


class CheckpointReader:
    """Reads whole safetensors files to one device; counts the bytes it read and where its time went.

    Mapped (the default, see default_staged): safetensors' own tensors of the memory-mapped file, on the CPU.
    Staged: through the pinned chunks to the device (ready on the current stream), in file order.
    read_s: file -> host memory; to_device_s: the staged copies to the device, waits for a staging buffer
    included. What the consumer does with a tensor between two of them is not counted here."""

    def __init__(self, device: torch.device, chunk_bytes: int = CHUNK_BYTES, staged: bool | None = None) -> None:
        self.device = device
        self.staged = default_staged() if staged is None else staged
        self.bytes_read = 0
        self.read_s = 0.0
        self.to_device_s = 0.0
        self._staging: list[torch.Tensor] = []
        self._copied: list = []  # per staging buffer: the event of the last copy out of it (GPU only)
        if self.staged:
            pin = device.type == "cuda"
            self._staging = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
            self._copied = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self._next = 0

    @property
    def name(self) -> str:
        return "staged" if self.staged else "mapped"

    def iter_file(self, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for each tensor of the file: on the device when staged, else on the CPU."""
        yield from (self._iter_staged(path) if self.staged else self._iter_mapped(path))

    def _iter_staged(self, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
        entries = read_header(path)
        with open(path, "rb", buffering=0) as f:
            for e in entries:
                f.seek(e.start)
                raw = self._read_staged(f, e.nbytes, path)
                self.bytes_read += e.nbytes
                yield e.name, raw.view(e.dtype).view(e.shape)

    def _iter_mapped(self, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    start = time.perf_counter()
                    tensor = f.get_tensor(name)
                    self.read_s += time.perf_counter() - start
                    self.bytes_read += tensor.numel() * tensor.element_size()
                    yield name, tensor
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights from {path}: {exc}") from None

    def _read_staged(self, f, nbytes: int, path: Path) -> torch.Tensor:
        out = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        chunk = self._staging[0].numel()
        for offset in range(0, nbytes, chunk):
            i, self._next = self._next, 1 - self._next
            start = time.perf_counter()
            if self._copied[i] is not None:
                self._copied[i].synchronize()  # the buffer's previous copy to the device is done
            n = min(chunk, nbytes - offset)
            read = time.perf_counter()
            _read_into(f, memoryview(self._staging[i].numpy())[:n], path)
            copy = time.perf_counter()
            out[offset:offset + n].copy_(self._staging[i][:n], non_blocking=True)
            if self._copied[i] is not None:
                self._copied[i].record()
            self.read_s += copy - read
            self.to_device_s += (read - start) + (time.perf_counter() - copy)
        return out


def _read_into(f, view: memoryview, path: Path) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise ModelLoadError(f"{path} ended early (truncated?)")
        done += n

