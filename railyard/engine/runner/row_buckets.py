"""Row counts that a step's eager matrix products see, rounded up to a finite set of buckets.

cuBLAS picks a kernel for each problem shape, and the first product at a row count whose kernel the process has
not used yet stalls the host until the device drains: the asynchronous pipeline loses a whole step, and every
stream in the batch waits that much longer for its next token. The kernel behind a row count cannot
be known in advance, and an eager step may hold any count up to the token budget, so the rows are padded up to a
bucket instead, and the start-up warm-up runs every bucket (gemm_warmup.py). Within each power-of-two octave
there are PER_OCTAVE buckets: at most 1/PER_OCTAVE of a step is padding, and a 16,384-token budget has ~96
buckets above 2,048 (the piecewise graphs' own buckets hold the steps below that).
"""

from __future__ import annotations

PER_OCTAVE = 32


def row_bucket(n: int, cap: int | None = None) -> int:
    """The bucket that holds n rows: n rounded up to a multiple of 2^floor(log2 n) / PER_OCTAVE (n itself below
    2 PER_OCTAVE); never above cap (the largest count a step can reach, itself a bucket)."""
    if n <= PER_OCTAVE:
        return n
    step = (1 << (n.bit_length() - 1)) // PER_OCTAVE
    bucket = -(-n // step) * step
    return bucket if cap is None else min(bucket, max(cap, n))


def row_buckets(lo: int, hi: int) -> list[int]:
    """Every bucket that a row count in [lo, hi] falls into (hi the cap), ascending."""
    if hi < lo:
        return []
    buckets, n = [], max(lo, 1)
    while n <= hi:
        b = row_bucket(n, hi)
        buckets.append(b)
        n = b + 1
    return buckets
