"""Triton GPU kernels (imported only on the GPU path: CI has no GPU and no triton)."""
