"""What railyard keeps on disk between starts, under one root: $RAILYARD_CACHE (default ~/.cache/railyard).

- `triton/`: Triton's compiled kernels (TRITON_CACHE_DIR, unless the user set that): a warm start loads
  them instead of compiling. Safe to keep: Triton keys each entry by the kernel's source, its
  specialisation, the compiler and the GPU, so a stale entry is never used.
- `tokenizers/`: each tokenizer AutoTokenizer loaded, pickled (tokenizer_cache.py): a warm front unpickles it
  instead of importing AutoTokenizer and transformers' model registry with it. Keyed by the tokenizer's files
  and the Python, transformers and tokenizers versions.
- the embedded tiny model (railyard.engine.startup.tiny_model).

Not kept, as vLLM does not keep them either: CUDA graphs (they hold device addresses of this process) and
the KV memory profile (it depends on what else holds memory on the GPU at start).
"""

from __future__ import annotations

import os
from pathlib import Path

from railyard.envs import cache_root


def configure_triton_cache() -> Path:
    """Point Triton's kernel cache under railyard's root (a TRITON_CACHE_DIR the user set wins); call before
    the first kernel compiles. Returns the directory in use."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = str(cache_root() / "triton")
    return Path(os.environ["TRITON_CACHE_DIR"])
