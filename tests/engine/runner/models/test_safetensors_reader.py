"""The checkpoint reader against safetensors' own loader: the same names, dtypes, shapes and bytes for every
dtype a checkpoint holds, a clear ModelLoadError for a broken file, and an account of its bytes and seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from railyard.engine.runner.models.safetensors_reader import CheckpointReader
from railyard.errors import ModelLoadError


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@pytest.fixture
def mixed_file(tmp_path) -> Path:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.bf16": torch.randn(7, 5, generator=gen).to(torch.bfloat16),
        "b.f32": torch.randn(3, generator=gen),
        "c.f16": torch.randn(2, 2, 2, generator=gen).half(),
        "d.fp8": torch.randn(4, 8, generator=gen).to(torch.float8_e4m3fn),
        "e.i64": torch.arange(5),
        "f.scalar": torch.tensor(2.5),
        "g.empty": torch.empty(0, 3),
        "h.bool": torch.tensor([True, False, True]),
    }
    path = tmp_path / "mixed.safetensors"
    save_file(tensors, str(path))
    return path


def test_reader_gives_what_safetensors_load_file_gives(mixed_file):
    expected = load_file(str(mixed_file))
    reader = CheckpointReader()
    got = dict(reader.iter_file(mixed_file))
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(_bytes(got[name]), _bytes(tensor)), name


def test_a_truncated_file_is_a_model_load_error(mixed_file, tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(mixed_file.read_bytes()[:-16])
    with pytest.raises(ModelLoadError, match="cut.safetensors"):
        list(CheckpointReader().iter_file(cut))


def test_a_file_that_is_not_safetensors_is_a_model_load_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="bad.safetensors"):
        list(CheckpointReader().iter_file(bad))


def test_a_reader_counts_the_files_bytes_and_times_its_reads(mixed_file):
    expected = load_file(str(mixed_file))
    reader = CheckpointReader()
    for _ in reader.iter_file(mixed_file):
        pass
    assert reader.bytes_read == sum(t.numel() * t.element_size() for t in expected.values())
    assert reader.read_s > 0.0 and reader.name == "mapped"
