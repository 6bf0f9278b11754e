"""LoRA adapters as the OpenAI front names them: vLLM's --lora-modules forms, the id each adapter gets, and the
adapters one served model has (a request's `model` names one; /v1/models lists them under their parent)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from railyard.engine.lora.request import LoRARequest
from railyard.errors import ConfigError, InvalidRequestError, UnknownLoRAError


@dataclass(frozen=True)
class LoRAModule:
    """An adapter to serve from the start: vLLM's LoRAModulePath (`name=path`, or JSON with base_model_name)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """`name=path` or `{"name": ..., "path": ..., "base_model_name": ...}`, as vLLM's --lora-modules takes them."""
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--lora-modules {text!r} is not valid JSON: {exc}") from None
        unknown = set(data) - {"name", "path", "base_model_name"} if isinstance(data, dict) else set()
        if not isinstance(data, dict) or unknown or not all(isinstance(data.get(k), str) and data[k]
                                                            for k in ("name", "path")):
            raise ConfigError(f"--lora-modules {text!r}: the JSON form is {{\"name\": ..., \"path\": ..., "
                              "\"base_model_name\": ... (optional)}} with string values")
        base = data.get("base_model_name")
        if base is not None and not isinstance(base, str):
            raise ConfigError(f"--lora-modules {text!r}: base_model_name must be a string")
        return LoRAModule(data["name"], data["path"], base)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ConfigError(f"--lora-modules {text!r}: give each adapter as name=path (or vLLM's JSON form)")
    return LoRAModule(name, path)


# The files whose bytes an adapter's id covers (PEFT's layout).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def lora_int_id(name: str, path: str) -> int:
    """An adapter's id, derived from its name, path and the bytes of its files: the same in every front process
    (the ingresses of a Ray deployment agree on it without talking, so their routers hash prompts under it as the
    replicas' caches do), and a new one when the files at the path change, so an adapter replaced in place and
    loaded again never meets prefix-cache blocks its old weights computed. Positive and below 2**62."""
    digest = hashlib.blake2b(f"{name}\0{path}".encode(), digest_size=8)
    for file in ADAPTER_FILES:
        digest.update(f"\0{file}\0".encode())
        try:
            with open(Path(path) / file, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:  # missing or unreadable: loading the adapter says so, with the reason
            digest.update(b"\0missing")
    return (int.from_bytes(digest.digest(), "big") >> 2) or 1


def lora_request(name: str, path: str) -> LoRARequest:
    """The engine's request for an adapter (InvalidRequestError for an empty name or path)."""
    return LoRARequest(name, lora_int_id(name, path), path)


class Adapters:
    """The LoRA adapters one served model has, by name (what its requests' `model` may say)."""

    def __init__(self, base_model: str) -> None:
        self.base_model = base_model
        self.by_name: dict[str, LoRARequest] = {}

    def get(self, name: str) -> LoRARequest | None:
        return self.by_name.get(name)

    def check_new(self, name: str, reserved: set[str]) -> None:
        """Refuse a name already taken by an adapter or a served model (vLLM's 400)."""
        if name in self.by_name:
            raise InvalidRequestError(f"The lora adapter '{name}' has already been loaded.")
        if name in reserved:
            raise InvalidRequestError(f"'{name}' is the name of a served model; give the adapter another name.")

    def add(self, request: LoRARequest) -> None:
        self.by_name[request.lora_name] = request

    def remove(self, name: str) -> LoRARequest:
        request = self.by_name.pop(name, None)
        if request is None:
            raise UnknownLoRAError(f"The lora adapter '{name}' cannot be found.")
        return request

    def cards(self, created: int) -> list[dict]:
        """vLLM's model cards of the adapters: `root` the adapter's path, `parent` the base model."""
        return [{"id": r.lora_name, "object": "model", "created": created, "owned_by": "railyard",
                 "root": r.lora_path, "parent": self.base_model} for r in self.by_name.values()]
