"""The embedded model: found in its cache without importing torch, so that a front process that only wants a named
shape's tokenizer (a Ray Serve replica taking a standby engine, whose core already holds the model) does not pay
torch's import (seconds on a GPU machine) on its way to serving."""

from __future__ import annotations

import subprocess
import sys

from railyard.engine.startup.tiny_model import ensure_tiny_model

_FRONT_OF_A_SHAPE = """
import sys
from railyard.engine.client.process import EngineProcessClient
from railyard.engine.config import EngineConfig
from railyard.engine.tokenizer import with_shape_tokenizer
import railyard.serve.replica

config = EngineConfig(model="qwen3-0.6b")
assert with_shape_tokenizer(config)
assert config.tokenizer == sys.argv[1], config.tokenizer
print("torch" in sys.modules)
"""


def test_a_named_shapes_front_finds_its_tokenizer_without_importing_torch():
    cached = str(ensure_tiny_model())  # written once (that needs torch); found from then on
    out = subprocess.run([sys.executable, "-c", _FRONT_OF_A_SHAPE, cached], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
