"""What Ray's processes import to build the app and start an engine replica: no torch (seconds on a GPU node,
paid by every new replica before it can even ask for its engine). torch is the engine core's own import, in its
own process."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray.serve")

_IMPORTS = """
import sys
import railyard.serve.app, railyard.serve.replica, railyard.serve.standby
print(sorted(m for m in ("torch", "triton", "xgrammar") if m in sys.modules))
"""


def test_the_app_and_the_engine_replica_import_no_torch():
    out = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
