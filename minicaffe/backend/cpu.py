"""The CPU backend: numpy arrays, numba @njit kernels from ``kernels/``, GEMM through BLAS.

Every function is the backend contract's (``contract.py``: the signatures and their meaning);
each forwards to its kernel family.  The kernel modules are looked up at call time, so
``kernels.use(family, version)`` switches the version the engine runs.
"""

import numpy as np

from kernels import elementwise, pooling, sgd, softmax
from kernels import gemm as _gemm
from kernels import im2col as _im2col

name = "cpu"
xp = np


def to_host(a):
    return a


def from_host(a, dtype=None):
    return np.asarray(a, dtype=dtype)


def synchronize():
    """Nothing to wait for: every CPU kernel has finished when it returns."""


# -- GEMM -------------------------------------------------------------------------------------
def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    """c = alpha * op(a) @ op(b) + beta * c, with op = transpose when trans_* is True."""
    _gemm.gemm(trans_a, trans_b, alpha, a, b, beta, c)


# -- convolution helpers ---------------------------------------------------------------------
def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    """x (N, C, H, W) -> col (C*kh*kw, N*OH*OW)."""
    _im2col.im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)


def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    """col (C*kh*kw, N*OH*OW) -> x (N, C, H, W), summing overlapping patches (x is overwritten)."""
    _im2col.col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x)


# -- pooling ----------------------------------------------------------------------------------
def max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask):
    pooling.max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask)


def max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    pooling.max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx)


def ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y):
    pooling.ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y)


def ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx):
    pooling.ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx)


# -- softmax ----------------------------------------------------------------------------------
def softmax_fwd(x, y):
    softmax.softmax_fwd(x, y)


def softmax_bwd(y, dy, dx):
    softmax.softmax_bwd(y, dy, dx)


def softmax_loss_fwd(prob, label, ignore_label, has_ignore):
    return softmax.softmax_loss_fwd(prob, label, ignore_label, has_ignore)


def softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
    softmax.softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx)


# -- elementwise ------------------------------------------------------------------------------
def relu_fwd(x, slope, y):
    elementwise.relu_fwd(x, slope, y)


def relu_bwd(x, dy, slope, dx):
    elementwise.relu_bwd(x, dy, slope, dx)


def sigmoid_fwd(x, y):
    elementwise.sigmoid_fwd(x, y)


def sigmoid_bwd(y, dy, dx):
    elementwise.sigmoid_bwd(y, dy, dx)


def tanh_fwd(x, y):
    elementwise.tanh_fwd(x, y)


def tanh_bwd(y, dy, dx):
    elementwise.tanh_bwd(y, dy, dx)


# -- solver update --------------------------------------------------------------------------------
def sgd_step(w, g, h, momentum, local_rate, decay):
    """One SGD iteration for a flat parameter, fused: h = m h + lr (g + decay w); w -= h.

    g is only read (the solver clears parameter diffs before the next step).
    """
    sgd.sgd_step(w, g, h, momentum, local_rate, decay)
