"""The checkpoint reader against safetensors' own loader: the same names, dtypes, shapes and bytes for every
dtype a checkpoint holds, and a clear ModelLoadError for a broken file; which reader runs is
$RAILYARD_WEIGHTS_READER's (mapped unless it says staged), and each reader accounts for its bytes and seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from railyard.engine.runner.models.safetensors_reader import READER_ENV, CheckpointReader, read_header
from railyard.errors import ConfigError, ModelLoadError


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


@pytest.mark.parametrize("staged", [False, True], ids=["mapped", "staged"])
def test_reader_gives_what_safetensors_load_file_gives(mixed_file, staged):
    expected = load_file(str(mixed_file))
    reader = CheckpointReader(torch.device("cpu"), chunk_bytes=8, staged=staged)  # many chunks per tensor
    got = dict(reader.iter_file(mixed_file))
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(_bytes(got[name]), _bytes(tensor)), name
    assert reader.bytes_read == sum(t.numel() * t.element_size() for t in expected.values())


def test_header_lists_tensors_in_file_order(mixed_file):
    entries = read_header(mixed_file)
    assert [e.start for e in entries] == sorted(e.start for e in entries)
    assert {e.name for e in entries} == set(load_file(str(mixed_file)))


@pytest.mark.parametrize("staged", [False, True], ids=["mapped", "staged"])
def test_a_truncated_file_is_a_model_load_error(mixed_file, tmp_path, staged):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(mixed_file.read_bytes()[:-16])
    with pytest.raises(ModelLoadError, match="cut.safetensors"):
        list(CheckpointReader(torch.device("cpu"), staged=staged).iter_file(cut))


def test_a_file_that_is_not_safetensors_is_a_model_load_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        read_header(bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned-chunk path to a GPU needs one")
def test_chunked_reads_to_the_gpu_give_the_same_bytes(mixed_file):
    expected = load_file(str(mixed_file))
    reader = CheckpointReader(torch.device("cuda"), chunk_bytes=8, staged=True)  # many chunks, both buffers reused
    got = {name: t.cpu() for name, t in reader.iter_file(mixed_file)}
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(_bytes(got[name]), _bytes(tensor)), name


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_mapped_reader_is_the_default_on_every_device(monkeypatch, device):
    monkeypatch.delenv(READER_ENV, raising=False)
    # mapped needs no device resources, so the default is visible without a GPU
    assert CheckpointReader(torch.device(device)).name == "mapped"


def test_the_environment_selects_the_staged_reader(monkeypatch):
    monkeypatch.setenv(READER_ENV, "staged")
    assert CheckpointReader(torch.device("cpu")).name == "staged"


def test_an_unknown_reader_name_is_a_config_error(monkeypatch):
    monkeypatch.setenv(READER_ENV, "fast")
    with pytest.raises(ConfigError, match="mapped, staged"):
        CheckpointReader(torch.device("cpu"))


@pytest.mark.parametrize("staged", [False, True], ids=["mapped", "staged"])
def test_a_reader_counts_the_files_bytes_and_times_its_reads(mixed_file, staged):
    expected = load_file(str(mixed_file))
    reader = CheckpointReader(torch.device("cpu"), chunk_bytes=8, staged=staged)
    for _ in reader.iter_file(mixed_file):
        pass
    assert reader.bytes_read == sum(t.numel() * t.element_size() for t in expected.values())
    assert reader.read_s > 0.0 and reader.to_device_s >= 0.0
