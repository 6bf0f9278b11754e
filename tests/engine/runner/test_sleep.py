"""Sleep mode's weights (runner/sleep.py): the device storage goes and comes back under the same Parameter objects,
tied weights stay one tensor, level 1 restores every value from the host copy, level 2 keeps only the buffers."""

from __future__ import annotations

import torch

from railyard.engine.runner.attention import get_backend
from railyard.engine.runner.models.loader import build_empty, random_weights
from railyard.engine.runner.sleep import device_bytes, put_to_sleep, wake_weights
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.model.spec import read_model_spec

CPU = torch.device("cpu")


def _model(tmp_path):
    spec = read_model_spec(write_tiny_checkpoint(tmp_path / "qwen3", "qwen3"))  # tied embeddings
    assert spec.tie_word_embeddings
    return random_weights(build_empty(spec, torch.float32, CPU, get_backend("torch", "cpu")), seed=3)


def _state(model) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def test_level_1_releases_every_weight_and_restores_each_value_under_the_same_parameter(tmp_path):
    model = _model(tmp_path)
    before, params = _state(model), dict(model.named_parameters())
    held = device_bytes([*model.parameters(), *model.buffers()])
    asleep = put_to_sleep(model, 1, CPU)
    assert device_bytes([*model.parameters(), *model.buffers()]) == 0
    assert asleep.host_bytes == held
    assert not any(copy.is_pinned() for _, copy in asleep.host)  # pinned only for a GPU's copy back
    wake_weights(asleep, CPU)
    after = _state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[n], before[n]) for n in before)
    assert all(p is params[n] for n, p in model.named_parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied: one tensor, one copy


def test_level_2_keeps_only_the_buffers_and_gives_parameters_zeroed_storage_of_their_shape(tmp_path):
    model = _model(tmp_path)
    before = _state(model)
    asleep = put_to_sleep(model, 2, CPU)
    assert asleep.host_bytes == device_bytes(list(before[n] for n, _ in model.named_buffers()))
    wake_weights(asleep, CPU)
    for name, p in model.named_parameters():
        assert p.shape == before[name].shape and not p.any()  # for the checkpoint to fill
    for name, b in model.named_buffers():
        assert torch.equal(b, before[name])
