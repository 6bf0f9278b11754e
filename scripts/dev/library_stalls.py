"""Whether an eager step's launch waits on the device for a library kernel after ready: the GPU test's check
(tests/engine/runner/test_gemm_warmup.py, blocked_launches) on qwen3-0.6b, as the engine runs (`padded`) or with
eager steps and the LM head's rows left unpadded (`unpadded`: the row count cuBLAS sees is the step's own, so the
warm-up's buckets do not cover it). Prints how many of 42 launches behind a busy device waited.

Usage: python3 scripts/dev/library_stalls.py padded|unpadded   (GPU; run from the repository root)
"""

from __future__ import annotations

import random
import sys

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

import railyard.engine.runner.model_runner as model_runner  # noqa: E402
from railyard.engine.config import EngineConfig  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from tests.engine.runner.test_gemm_warmup import blocked_launches  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "padded"
if mode not in ("padded", "unpadded"):
    sys.exit("usage: library_stalls.py padded|unpadded")
if mode == "unpadded":
    model_runner.row_bucket = lambda n, cap=None: n
engine = Engine.from_config(EngineConfig(model="qwen3-0.6b", max_num_batched_tokens=8192, max_num_seqs=64,
                                         max_model_len=4096))
runner = engine.executor.runner
rng = random.Random(0)
lo = runner.piecewise.max_tokens + 1
counts = [lo, 8192] + rng.sample(range(lo, 8192), 40)
blocked = blocked_launches(runner, counts, rng)
print(f"{mode}: {len(blocked)} of {len(counts)} launches waited (tokens, sampled rows, host s, device s): {blocked[:10]}")
