"""Triton's CPU interpreter where there is no GPU, patched as for the attention kernels' tests."""

import tests.engine.runner.attention.conftest  # noqa: F401 (sets TRITON_INTERPRET and patches the interpreter)
