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
    if _interp is not None and not hasattr(_interp.InterpreterBuilder, "create_dot_scaled"):
        # Its tl.dot_scaled (microscaled operands: the MXFP4 experts' GEMM on bf16 activations) is missing: the
        # semantic layer gets the format strings unwrapped (compiled kernels see constexprs) and the builder has no
        # op. Given both, as the GPU computes it: each e2m1 operand widened with its e8m0 scales (to bf16: exact),
        # the product accumulated in float32.
        from triton._C.libtriton import ir as _ir
        from triton.language.semantic import TritonSemantic as _Semantic

        _original_dot_scaled = _Semantic.dot_scaled

        def dot_scaled(self, lhs, lhs_scale, lhs_format, rhs, rhs_scale, rhs_format, *args, **kwargs):
            def wrap(fmt):
                return _tl.constexpr(fmt) if isinstance(fmt, str) else fmt
            return _original_dot_scaled(self, lhs, lhs_scale, wrap(lhs_format), rhs, rhs_scale, wrap(rhs_format),
                                        *args, **kwargs)

        _Semantic.dot_scaled = dot_scaled
        _E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                         dtype=np.float32)

        def _widened(handle, scale, fmt, k_axis):
            """An operand as float32 with K along k_axis: bf16 / fp16 as they are, e2m1 unpacked (low nibble first
            along K) and multiplied by its scales ([rows, K / 32], rows the other axis)."""
            if fmt == _ir.ScaleDotElemTypeTY.BF16:
                values = _widen_bf16(handle).data
            elif fmt == _ir.ScaleDotElemTypeTY.FP16:
                values = handle.data.astype(np.float32)
            elif fmt == _ir.ScaleDotElemTypeTY.E2M1:
                packed = np.moveaxis(handle.data, k_axis, -1)
                values = np.stack((_E2M1[packed & 15], _E2M1[packed >> 4]), axis=-1).reshape(*packed.shape[:-1], -1)
                values = np.moveaxis(values, -1, k_axis)
            else:
                raise NotImplementedError(f"interpreted dot_scaled of {fmt}")
            if scale is not None:
                factors = np.ldexp(np.float32(1), scale.data.astype(np.int32) - 127).astype(np.float32)
                factors = np.repeat(factors, 32, axis=-1)  # [rows, K]
                values = values * (factors if k_axis == 1 else factors.T)
            return values

        def create_dot_scaled(self, lhs, lhs_scale, lhs_format, rhs, rhs_scale, rhs_format, fast_math, lhs_k_pack,
                              rhs_k_pack, acc):
            assert lhs_k_pack and rhs_k_pack, "interpreted dot_scaled packs e2m1 along K only"
            a = _widened(lhs, lhs_scale, lhs_format, 1)
            b = _widened(rhs, rhs_scale, rhs_format, 0)
            return _interp.TensorHandle((acc.data + a @ b).astype(np.float32), acc.dtype.scalar)

        _interp.InterpreterBuilder.create_dot_scaled = create_dot_scaled
