"""Read safetensors files and time what the reading takes.

safetensors' own `get_tensor` on the memory-mapped file gives CPU tensors that the loader copies into its
parameters (to a GPU from pageable memory): the fastest path measured from the page cache (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from railyard.errors import ModelLoadError


class CheckpointReader:
    """Reads whole safetensors files, memory-mapped, as CPU tensors; counts the bytes it read and its seconds.

    read_s: safetensors' reading only; the tensors are views of the mapped file, so paging them in happens in the
    consumer's copy into its parameters. to_device_s stays 0: the consumer copies to the device."""

    name = "mapped"

    def __init__(self) -> None:
        self.bytes_read = 0
        self.read_s = 0.0
        self.to_device_s = 0.0

    def iter_file(self, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for each tensor of the file, on the CPU."""
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
