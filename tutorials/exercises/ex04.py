"""Lesson 4 exercises.  Check with ``python -m tutorials.check 04``."""

import numba  # noqa: F401
import numpy as np  # noqa: F401


def matmul_ikj(a, b):
    """a (M, K) @ b (K, N) as a new float32 (M, N) array, loops in the order i, p, j (the inner
    loop runs along a row of b and of c).  Decorate it with @numba.njit."""
    raise NotImplementedError


def gemm_intensity(m, n, k):
    """Flops per byte of a float32 GEMM that reads A (m, k) and B (k, n) once and writes C (m, n)
    once: 2*m*n*k flops over 4*(m*k + k*n + m*n) bytes."""
    raise NotImplementedError


def roofline(intensity, peak, bandwidth):
    """The attainable flop rate: the smaller of ``peak`` and ``intensity * bandwidth``."""
    raise NotImplementedError
