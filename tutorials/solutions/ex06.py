"""Lesson 6: reference solutions."""

import numpy as np
from numba import cuda


@cuda.jit
def scale_kernel(x, a, out):
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for i in range(start, x.size, cuda.gridDim.x * cuda.blockDim.x):
        out[i] = a * x[i]


@cuda.jit
def block_max(x, out):
    s = cuda.shared.array(8, np.float32)
    t = cuda.threadIdx.x
    m = -np.inf
    for i in range(t, x.size, cuda.blockDim.x):
        m = max(m, x[i])
    s[t] = m
    cuda.syncthreads()
    half = 4
    while half > 0:
        if t < half:
            s[t] = max(s[t], s[t + half])
        cuda.syncthreads()
        half //= 2
    if t == 0:
        out[0] = s[0]
