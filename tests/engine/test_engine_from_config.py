"""Engine.from_config: a checkpoint directory always wins over a named shape of the same name."""

from __future__ import annotations

from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine
from railyard.engine.startup.tiny_model import write_tiny_checkpoint


def test_a_local_directory_named_like_a_shape_is_loaded_not_replaced_by_random_weights(tmp_path, monkeypatch):
    write_tiny_checkpoint(tmp_path / "qwen2-7b", "qwen2")
    monkeypatch.chdir(tmp_path)
    engine = Engine.from_config(EngineConfig(model="qwen2-7b", max_model_len=64))
    assert engine.spec.vocab_size == 259  # the tiny checkpoint, not Qwen2-7B's 152,064
    assert engine.tokenizer is not None
