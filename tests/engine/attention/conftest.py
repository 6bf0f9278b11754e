"""Run the Triton kernels in Triton's CPU interpreter when there is no GPU.

Triton 3.6's interpreter converts a loaded scalar (a one-element array) with `int(array)`, which
NumPy >= 2.4 refuses; loop bounds read from memory then fail. Convert through `.item()` instead.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton.runtime.interpreter as _interp
    except ImportError:
        _interp = None
    if _interp is not None and hasattr(_interp, "_patch_lang_tensor"):
        _original = _interp._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            _original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        _interp._patch_lang_tensor = _patch_lang_tensor
