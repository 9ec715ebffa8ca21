"""Kernels that do in one launch what a layer would otherwise do in several array operations
(each a separate kernel on a GPU, and a separate ~10-40 us launch from Python).

    bias_bwd(L, dy, db, dout=None)
        dy (N, M, S): db[m] += sum over n, s of dy[n, m, s] -- the bias gradient of Convolution
        (S = OH*OW) and of InnerProduct (dy (rows, M) read as (rows, M, 1)).  With ``dout``
        (M, N*S) it also writes dy transposed, dout[m, n*S + s] = dy[n, m, s]: the layout the
        convolution's weight-gradient GEMM reads.  As array operations that is a transpose copy,
        a sum and an add: three launches and a temporary; here one pass over dy.

Thread mapping: block b (grid-stride) -> channel m; its ROW threads stride over the N*S values of
that channel (consecutive threads take consecutive s: coalesced reads of dy and writes of dout),
each summing in float64; one tree reduction per channel (``_reduce.block_reduce``) and thread 0
adds the channel's total to db[m].  Deterministic (no atomics).  Checked against numpy in
tests/test_cuda_launch.py.
"""

import numpy as np
from numba import cuda

from ._reduce import block_reduce

__all__ = ["bias_bwd", "make_bias_kernels"]

_cache = {}


def make_bias_kernels(ROW):
    """(bias_bwd, bias_bwd_transpose) for blocks of ROW threads (a power of two)."""
    if ROW in _cache:
        return _cache[ROW]
    if ROW & (ROW - 1):
        raise ValueError(f"bias_bwd: ROW must be a power of two, got {ROW}")

    @cuda.jit
    def bias_bwd(dy, db):
        red = cuda.shared.array(ROW, dtype=np.float64)
        N, M, S = dy.shape
        for m in range(cuda.blockIdx.x, M, cuda.gridDim.x):
            acc = 0.0
            for t in range(cuda.threadIdx.x, N * S, ROW):
                n = t // S
                acc += dy[n, m, t - n * S]
            acc = block_reduce(red, acc, False)
            if cuda.threadIdx.x == 0:
                db[m] += acc

    @cuda.jit
    def bias_bwd_transpose(dy, db, dout):
        red = cuda.shared.array(ROW, dtype=np.float64)
        N, M, S = dy.shape
        for m in range(cuda.blockIdx.x, M, cuda.gridDim.x):
            acc = 0.0
            for t in range(cuda.threadIdx.x, N * S, ROW):
                n = t // S
                v = dy[n, m, t - n * S]
                dout[m, t] = v
                acc += v
            acc = block_reduce(red, acc, False)
            if cuda.threadIdx.x == 0:
                db[m] += acc

    _cache[ROW] = (bias_bwd, bias_bwd_transpose)
    return _cache[ROW]


def bias_bwd(L, dy, db, dout=None):
    if dy.ndim != 3 or db.ndim != 1 or db.shape[0] != dy.shape[1]:
        raise ValueError(f"bias_bwd: dy must be (N, M, S) and db (M,), got {tuple(dy.shape)} and {tuple(db.shape)}")
    N, M, S = dy.shape
    if dout is not None and tuple(dout.shape) != (M, N * S):
        raise ValueError(f"bias_bwd: dout must be (M, N*S) = {(M, N * S)}, got {tuple(dout.shape)}")
    if not dy.size:
        return
    R = L.config.row_threads
    k, kt = make_bias_kernels(R)
    if dout is None:
        L.launch1d(k, M, dy, db, per_block=1, block=R)
    else:
        L.launch1d(kt, M, dy, db, dout, per_block=1, block=R)
