"""Run the Triton kernels in Triton's CPU interpreter when there is no GPU.

Triton 3.6's interpreter converts a loaded scalar (a one-element array) with `int(array)`, which
NumPy >= 2.4 refuses; loop bounds read from memory then fail. Convert through `.item()` instead.

Its tl.dot multiplies bfloat16 operands as the uint16 words it stores them in; they are widened to float32 first
(exact), as the GPU's bf16 MMA multiplies them into a float32 accumulator.

Its float32 -> float8e4nv cast rounds half up and drops the carry when rounding crosses into the next
binade (7.93 becomes 4.0, not 8.0); the GPU rounds to nearest even (cvt.rn.satfinite). Such casts go
through torch's float8_e4m3fn conversion instead, which rounds as the GPU does.
"""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton.language as _tl
        import triton.runtime.interpreter as _interp
    except ImportError:
        _interp = None
    if _interp is not None and hasattr(_interp, "_patch_lang_tensor"):
        _original = _interp._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            _original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        _interp._patch_lang_tensor = _patch_lang_tensor
    if _interp is not None and hasattr(_interp, "_convert_float"):
        _original_convert = _interp._convert_float

        def _convert_float(input, input_dtype, output_dtype, rounding_mode):
            if input_dtype == _tl.float32 and output_dtype == _tl.float8e4nv:
                as_f32 = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
                return as_f32.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return _original_convert(input, input_dtype, output_dtype, rounding_mode)

        _interp._convert_float = _convert_float
    if _interp is not None and hasattr(_interp.InterpreterBuilder, "create_dot"):
        _original_dot = _interp.InterpreterBuilder.create_dot

        def _widen_bf16(handle):
            if handle.dtype.scalar != _tl.bfloat16:
                return handle
            return _interp.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), _tl.float32)

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return _original_dot(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)

        _interp.InterpreterBuilder.create_dot = create_dot
