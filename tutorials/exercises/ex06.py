"""Lesson 6 exercises: CUDA kernels, checked in numba's simulator.
Check with ``python -m tutorials.check 06``.  Decorate each kernel with ``@cuda.jit``."""

import numpy as np  # noqa: F401
from numba import cuda  # noqa: F401


def scale_kernel(x, a, out):
    """out[i] = a * x[i] for every i, with a grid-stride loop (any number of blocks and threads)."""
    raise NotImplementedError


def block_max(x, out):
    """Launched as block_max[1, 8](x, out): out[0] = max(x) for any length of x >= 1.  Each of
    the 8 threads takes the max of its grid-stride share, then a tree in shared memory."""
    raise NotImplementedError
