"""The CPU backend: numpy arrays, numba @njit kernels from ``kernels/``, GEMM through BLAS.

Every function is the backend contract's (``contract.py``: the signatures and their meaning);
each forwards to its kernel family.  The kernel modules are looked up at call time, so
``kernels.use(family, version)`` switches the version the engine runs.
"""

import numpy as np

from kernels import conv as _conv
from kernels import elementwise, pooling, sgd, softmax
from kernels import gemm as _gemm
from kernels import im2col as _im2col

name = "cpu"
xp = np
host_lanes = True  # lanes (minicaffe/parallel/lanes.py, plan.py) split a batch across threads


def to_host(a):
    return a


def from_host(a, dtype=None):
    return np.asarray(a, dtype=dtype)


def synchronize():
    """Nothing to wait for: every CPU kernel has finished when it returns."""


def precompile(dtype):
    """Nothing ahead of time: the CPU kernels compile (and cache on disk) at their first call."""
    return 0


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


#: most taps (C*kh*kw) for which the direct kernel (kernels/conv.py v6_shifted) runs a stride-1
#: convolution.  Measured on one core against the layer's im2col + BLAS with its buffers kept,
#: it is 1.3-2x faster on LeNet's conv1 (25 taps) and CIFAR-10 quick's conv1 (75 taps), and
#: slower at a few hundred taps on small images (LeNet's conv2: 500 taps, measured with the
#: kernel's first form, which computed its 8-wide output rows 12 wide) -- docs/CPU_SPEED.md
DIRECT_MAX_TAPS = 128


def conv_direct(channels, kh, kw, sh, sw):
    return sh == 1 and sw == 1 and channels * kh * kw <= DIRECT_MAX_TAPS


def conv_direct_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    _conv.shifted_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y)


def conv_direct_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, db):
    _conv.shifted_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, db)


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
    if isinstance(scale, tuple):  # (top diff, status): both host arrays here
        top_diff, status = scale
        scale = float(top_diff.reshape(-1)[0]) / float(status[3])
    softmax.softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx)


def softmax_xent_fwd(x, label, ignore_label, has_ignore, normalizer, prob, status, loss):
    """softmax_fwd, then the loss kernel of the current softmax_loss_fwd version (which reports a
    bad label's position instead of raising), the result written as the contract says."""
    softmax.softmax_fwd(x, prob)
    outer, _, inner = prob.shape
    if label.size != outer * inner:
        raise ValueError(f"softmax loss: label has {label.size} elements, prob {prob.shape} needs {outer * inner}")
    lab = label.reshape(outer, inner)
    total, count, bad = softmax.softmax_loss_fwd.kernel(prob, lab, int(ignore_label), bool(has_ignore))
    n = float(normalizer) if normalizer > 0 else float(max(count, 1))
    status[:] = (total, count, np.inf if bad < 0 else bad, n)
    loss.reshape(-1)[0] = np.nan if bad >= 0 else total / n


def bias_bwd(dy, db, dout):
    """Summed in the order the layers summed before this entry existed (bit-identical results)."""
    N, M, S = dy.shape
    if dout is not None:
        dout.reshape(M, N, S)[...] = dy.transpose(1, 0, 2)
        db += dout.sum(axis=1)
    elif S == 1:
        db += dy.reshape(N, M).sum(axis=0)
    else:
        db += dy.transpose(1, 0, 2).reshape(M, N * S).sum(axis=1)


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
    if hasattr(local_rate, "shape"):  # the rate in a 1-element array
        local_rate = float(local_rate.reshape(-1)[0])
    sgd.sgd_step(w, g, h, momentum, local_rate, decay)


def sgd_step_segments(w, g, h, offsets, momentum, rates, decays):
    """sgd_step on each parameter's slice in turn."""
    for s in range(len(rates)):
        a, b = int(offsets[s]), int(offsets[s + 1])
        sgd.sgd_step(w[a:b], g[a:b], h[a:b], momentum, float(rates[s]), float(decays[s]))
