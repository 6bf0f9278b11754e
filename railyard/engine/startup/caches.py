"""What railyard keeps on disk between starts, under one root: $RAILYARD_CACHE (default ~/.cache/railyard).

- `triton/`: Triton's compiled kernels (TRITON_CACHE_DIR, unless the user set that): a warm start loads
  them instead of compiling. Safe to keep: Triton keys each entry by the kernel's source, its
  specialisation, the compiler and the GPU, so a stale entry is never used.
- `tokenizers/`: each tokenizer AutoTokenizer loaded, pickled (tokenizer_cache.py): a warm front unpickles it
  instead of importing AutoTokenizer and transformers' model registry with it. Keyed by the tokenizer's files
  and the Python, transformers and tokenizers versions.
- the embedded tiny model (railyard.engine.startup.tiny_model).
- `python/`: the bytecode of the Python modules a start imports, where the installation ships none (uv installs
  without it; images often set PYTHONDONTWRITEBYTECODE), which every start would otherwise compile from its sources.
  A PYTHONPYCACHEPREFIX the user set wins; an installation with its bytecode beside the sources is left alone.

- `last_start.json`: how the last engine start here met the kernel cache (cold: every kernel compiled; warm: all
  loaded), which `railyard doctor` reports.

Where the root lives decides whether a replica starts warm: the stack file's kernel_cache (a pod's own volume, a
node's directory, or one baked into the image by `railyard cache fill`) mounts it there and sets $RAILYARD_CACHE.

Not kept, as vLLM does not keep them either: CUDA graphs (they hold device addresses of this process) and
the KV memory profile (it depends on what else holds memory on the GPU at start).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from railyard.envs import cache_root

log = logging.getLogger("railyard.engine")
LAST_START = "last_start.json"
BYTECODE = "python"
_BYTECODE_PROBE = "torch"  # the bulk of what a start imports: whether it ships bytecode decides


def configure_bytecode_cache(probe: str = _BYTECODE_PROBE) -> Path | None:
    """Keep Python's bytecode under railyard's root (`python/`) when the installation has none beside `probe`'s
    sources, so that only the first start on a root compiles them; call before the heavy imports. Processes this one
    starts inherit the prefix (PYTHONPYCACHEPREFIX); multiprocessing's children, started with -B where this one
    was, write their own imports there too once they call this. Returns the directory in use, or None where Python's
    own arrangement stands (a prefix the user set, bytecode beside the sources, a root that is not writable)."""
    ours = cache_root() / BYTECODE
    if sys.pycache_prefix is not None:
        if Path(sys.pycache_prefix) != ours:
            return None  # the user's PYTHONPYCACHEPREFIX
        sys.dont_write_bytecode = False  # inherited from the process that chose ours
        return ours
    spec = importlib.util.find_spec(probe)
    if spec is None or spec.cached is None or os.path.exists(spec.cached) or not writable(ours):
        return None
    sys.pycache_prefix = str(ours)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(ours)
    return ours


def bytecode_cache_state(directory: Path | None, probe: str = _BYTECODE_PROBE) -> str | None:
    """Before `probe`'s import, with configure_bytecode_cache's directory: "warm" (its bytecode is there from an
    earlier start) or "cold" (this start compiles its sources); None where Python's own arrangement stands."""
    if directory is None:
        return None
    spec = importlib.util.find_spec(probe)
    if spec is None or spec.cached is None:
        return None
    return "warm" if os.path.exists(spec.cached) else "cold"


def configure_triton_cache() -> Path:
    """Point Triton's kernel cache under railyard's root (a TRITON_CACHE_DIR the user set wins); call before
    the first kernel compiles. Returns the directory in use: a temporary one, with a warning, where that one is
    not writable (a read-only image layer, a node directory owned by another user), since Triton fails a compile
    it cannot store."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = str(cache_root() / "triton")
    path = Path(os.environ["TRITON_CACHE_DIR"])
    if not writable(path):
        fallback = Path(tempfile.mkdtemp(prefix="railyard-triton-"))
        log.warning("the kernel cache %s is not writable here (uid %d): kernels compile into %s, which this process "
                    "does not outlive, so every start is cold; make it writable (the rendered pods run as uid 1000)",
                    path, os.getuid(), fallback)
        os.environ["TRITON_CACHE_DIR"] = str(fallback)
        path = fallback
    return path


def writable(path: Path) -> bool:
    """Whether this process can create the directory (if need be) and files in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".railyard-probe-"):
            return True
    except OSError:
        return False


def record_start(report: dict, root: Path | None = None) -> None:
    """Keep how this start met the kernel cache (StartupTimes' kernel_cache and counts) as the root's
    last_start.json, for `railyard doctor`; best effort (a read-only root keeps none)."""
    root = root or cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=root, prefix=".last_start-", delete=False) as tmp:
            json.dump({**report, "at": round(time.time(), 3)}, tmp)
        os.replace(tmp.name, root / LAST_START)
    except OSError:
        pass
