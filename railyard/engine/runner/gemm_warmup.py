"""The start-up warm-up of the matrix products an eager step makes, at every row bucket (row_buckets.py).

A library GEMM (cuBLAS, behind F.linear) is not a kernel the engine compiles: which kernel it runs is the
library's choice per problem shape, and the first use of each stalls the host (see row_buckets.py). The step walk
in warmup.py reaches every Triton specialisation, but running a whole forward pass at each of ~100 row buckets
would cost seconds on a 7B model. So the products themselves are recorded once, from one eager forward pass (each
distinct weight shape once: every layer of a model repeats the same few), and run alone at every bucket: a few
GEMMs per bucket instead of a whole model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_LINEAR = F.linear  # the function itself, as a torch function mode is handed it


@dataclass(frozen=True)
class Product:
    """One distinct matrix product of a forward pass: x [rows, in] @ weight [out, in]^T (+ bias)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    input_dtype: torch.dtype


class LinearRecorder(TorchFunctionMode):
    """Records each distinct F.linear a block of code calls (by weight shape, dtypes and bias), running it as is."""

    def __init__(self) -> None:
        super().__init__()
        self.products: dict[tuple, Product] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _LINEAR:
            x = args[0] if args else kwargs["input"]
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            key = (tuple(weight.shape), weight.dtype, weight.stride(), bias is not None, x.dtype)
            self.products.setdefault(key, Product(weight, bias, x.dtype))
        return func(*args, **kwargs)


def record_products(forward: Callable[[], object]) -> list[Product]:
    """The distinct F.linear products that forward() makes (it runs once, for real)."""
    with LinearRecorder() as recorder:
        forward()
    return list(recorder.products.values())


def warm_products(products: Iterable[Product], row_counts: Iterable[int], device: torch.device) -> int:
    """Each product once at each row count; returns the number of products run. The input is zeros: a library
    picks its kernel by shape, alignment and dtype, never by values."""
    products, counts = list(products), sorted(set(row_counts))
    if not products or not counts:
        return 0
    runs = 0
    for dtype in {p.input_dtype for p in products}:
        # One buffer, viewed as a contiguous [rows, in] input of each product (the leading dimension a forward
        # pass hands the library, which its choice of kernel depends on).
        flat = torch.zeros(counts[-1] * max(p.weight.shape[-1] for p in products), dtype=dtype, device=device)
        for rows in counts:
            for p in products:
                if p.input_dtype == dtype:
                    width = p.weight.shape[-1]
                    F.linear(flat[:rows * width].view(rows, width), p.weight, p.bias)
                    runs += 1
        del flat
    return runs
