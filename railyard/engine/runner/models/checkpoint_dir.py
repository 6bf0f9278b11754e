"""A checkpoint directory and its weight files, torch-free: the front checks a --model path before the engine
process starts, without importing torch."""

from __future__ import annotations

import json
from pathlib import Path

from railyard.errors import ModelLoadError


def resolve_model_dir(model: str) -> Path:
    """The local checkpoint directory for a path (or the embedded model's name, tiny-qwen2-seed0), with a clear
    error for a hub id or a bad path."""
    if not model:
        raise ModelLoadError("no model given: pass a local checkpoint directory (e.g. --model /models/qwen2-7b)")
    path = Path(model).expanduser()
    if not path.exists():
        from railyard.engine.startup.tiny_model import embedded_model_dir

        embedded = embedded_model_dir(model)  # the name the server and README give the embedded model
        if embedded is not None:
            return embedded
        looks_like_hub_id = "/" in model and not model.startswith(("/", ".", "~")) and model.count("/") == 1
        hint = (" It looks like a Hugging Face hub id: railyard never downloads weights at run time; "
                "download the checkpoint first and pass its local directory.") if looks_like_hub_id else ""
        raise ModelLoadError(f"model directory {model!r} does not exist.{hint}")
    if not path.is_dir():
        raise ModelLoadError(f"model path {model!r} is not a directory (expected an HF checkpoint directory)")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: not an HF-format checkpoint directory")
    return path


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index} is malformed: {exc}") from None
        files = [model_dir / n for n in names]
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{model_dir} is missing weight shards listed in its index: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} has no *.safetensors weights (pickled .bin weights are not loaded)")
    return files
