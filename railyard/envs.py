"""Every environment variable railyard reads, each with its default and one line of doc (as vLLM's envs.py).

What a user sets per run is a flag (EngineConfig derives the engine's); only what must reach processes railyard
does not start itself, or a secret better kept off command lines, lives here. `ENV.NAME` reads it when asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, the value it has when unset, and what it does."""

    name: str
    default: str | None
    doc: str

    def get(self) -> str | None:
        return os.environ.get(self.name, self.default)


RAILYARD_CACHE = EnvVar(
    "RAILYARD_CACHE", str(Path("~") / ".cache" / "railyard"),
    "root of what railyard keeps between starts: Triton's kernels, pickled tokenizers, the embedded tiny model")
RAILYARD_API_KEY = EnvVar(
    "RAILYARD_API_KEY", None,
    "the key `railyard serve` requires as 'Authorization: Bearer KEY' when --api-key is not given (unset: none)")

VARIABLES: dict[str, EnvVar] = {v.name: v for v in (RAILYARD_CACHE, RAILYARD_API_KEY)}


def cache_root() -> Path:
    """The root of railyard's caches ($RAILYARD_CACHE, ~ expanded)."""
    return Path(RAILYARD_CACHE.get()).expanduser()
