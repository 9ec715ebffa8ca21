"""The backend contract's functions (``contract.py``) for both GPU backends, launched by this
process's launcher (``kernels/cuda/_launch.py``).

``cuda`` and ``cudasim`` are the same code: the kernels are the same ``@cuda.jit`` functions;
the backends differ only in the array module (CuPy / numpy) and in how a kernel is launched,
which is the launcher's business.  numba fixes its CUDA target (real or simulator) once per
process, so a process has one launcher, and importing this module -- which the backend modules
do after ``_gpu.require`` has checked and chosen the target -- creates it.  Each function looks
its kernel up at call time, so ``kernels.cuda.use(family, version)`` switches what the engine
runs.
"""

import numpy as np

import kernels.cuda as _kc
from kernels.cuda import _launch, elementwise, pooling, sgd, softmax
from kernels.cuda import fused as _fused
from kernels.cuda import gemm as _gemm
from kernels.cuda import im2col as _im2col

#: the launcher of this process's CUDA target
L = _launch.launcher()
_kc.apply_env()

transfers = L.transfers
launches = L.launches
capturing = L.capturing
capture = L.capture
to_host = L.to_host
from_host = L.from_host
synchronize = L.synchronize


def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    _gemm.gemm(L, trans_a, trans_b, alpha, a, b, beta, c)


def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    _im2col.im2col(L, x, kh, kw, ph, pw, sh, sw, dh, dw, col)


def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    _im2col.col2im(L, col, kh, kw, ph, pw, sh, sw, dh, dw, x)


def conv_direct(channels, kh, kw, sh, sw):
    """No direct convolution kernels on the GPU: the layer runs im2col + cuBLAS."""
    return False


def conv_direct_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    raise NotImplementedError("the GPU backends have no direct convolution (conv_direct is False)")


def conv_direct_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, db):
    raise NotImplementedError("the GPU backends have no direct convolution (conv_direct is False)")


def max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask):
    pooling.max_pool_fwd(L, x, kh, kw, sh, sw, ph, pw, y, mask)


def max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    pooling.max_pool_bwd(L, dy, mask, kh, kw, sh, sw, ph, pw, dx)


def ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y):
    pooling.ave_pool_fwd(L, x, kh, kw, sh, sw, ph, pw, y)


def ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx):
    pooling.ave_pool_bwd(L, dy, kh, kw, sh, sw, ph, pw, dx)


def softmax_fwd(x, y):
    softmax.softmax_fwd(L, x, y)


def softmax_bwd(y, dy, dx):
    softmax.softmax_bwd(L, y, dy, dx)


def softmax_loss_fwd(prob, label, ignore_label, has_ignore):
    return softmax.softmax_loss_fwd(L, prob, label, ignore_label, has_ignore)


def softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
    softmax.softmax_loss_bwd(L, prob, label, ignore_label, has_ignore, scale, dx)


def relu_fwd(x, slope, y):
    elementwise.relu_fwd(L, x, slope, y)


def relu_bwd(x, dy, slope, dx):
    elementwise.relu_bwd(L, x, dy, slope, dx)


def sigmoid_fwd(x, y):
    elementwise.sigmoid_fwd(L, x, y)


def sigmoid_bwd(y, dy, dx):
    elementwise.sigmoid_bwd(L, y, dy, dx)


def tanh_fwd(x, y):
    elementwise.tanh_fwd(L, x, y)


def tanh_bwd(y, dy, dx):
    elementwise.tanh_bwd(L, y, dy, dx)


def sgd_step(w, g, h, momentum, local_rate, decay):
    sgd.sgd_step(L, w, g, h, momentum, local_rate, decay)


def softmax_xent_fwd(x, label, ignore_label, has_ignore, normalizer, prob, status, loss):
    softmax.softmax_xent_fwd_device(L, x, label, ignore_label, has_ignore, normalizer, prob, status, loss)


def sgd_step_segments(w, g, h, offsets, momentum, rates, decays):
    sgd.sgd_step_segments(L, w, g, h, offsets, momentum, rates, decays)


def bias_bwd(dy, db, dout):
    _fused.bias_bwd(L, dy, db, dout)


_precompiled = set()


def precompile(dtype):
    """Compile the engine's kernels for ``dtype`` now (kernels/cuda/_signatures.py): a net built
    on a GPU backend calls this, so its first training step compiles nothing.  Once per dtype
    and process; returns how many kernels were compiled by this call."""
    key = np.dtype(dtype).str
    if key in _precompiled:
        return 0
    from kernels.cuda._signatures import signatures

    n = sum(L.precompile(kernel, sig) for kernel, sig in signatures(L, dtype))
    _precompiled.add(key)
    return n
