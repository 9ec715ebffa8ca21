"""The explicit signatures of the kernels the engine launches, per dtype: what the GPU backends
compile when a net is built (``Launcher.precompile``), so that no launch inside a training step
compiles.

Each entry is (kernel, argument types) with numba's types as its dispatcher computes them at a
launch: the engine's arrays are C-contiguous (blob storage and its reshapes, contiguous slices of
it), so every array is ``Array(dtype, ndim, 'C')``; geometry is Python ints (int64), flags Python
bools, kernel scalars numpy scalars of the arrays' dtype (``Launcher.scalar``).  The kernels are
those of the default versions (and of both softmax paths ``v3_auto`` chooses between); a version
switched to with ``kernels.cuda.use`` compiles at its first launch, as numba does.

The simulator compiles nothing; there, every launch's types are checked against this list
(``Launcher.lazy_compiles``), which is how tests/test_cuda_launch.py proves it complete for a
training step.
"""

import numpy as np
from numba import types as T
from numba.np.numpy_support import from_dtype

from . import elementwise, fused, im2col, pooling, sgd, softmax


def signatures(L, dtype):
    """[(kernel, argtypes)] for the engine's kernels in ``dtype`` under launcher ``L``'s sizes."""
    f = from_dtype(np.dtype(dtype))
    i64, b1, f64 = T.int64, T.boolean, T.float64

    def A(nd, dt=f):
        return T.Array(dt, nd, "C")

    geo8 = (i64,) * 8
    geo6 = (i64,) * 6
    mask = A(4, T.int32)
    status = A(1, f64)
    R, TT = L.config.row_threads, L.config.row_threads
    fwd_block, bwd_block = softmax.make_block_kernels(R)
    softmax.make_loss_kernels(TT)
    _, xent_multi, xent_one = softmax._loss_cache[TT]
    bias, bias_t = fused.make_bias_kernels(R)
    return [
        # elementwise (v2_gridstride)
        (elementwise._relu_fwd_v2, (A(1), f, A(1))),
        (elementwise._relu_bwd_v2, (A(1), A(1), f, A(1))),
        (elementwise._sigmoid_fwd_v2, (A(1), A(1))),
        (elementwise._sigmoid_bwd_v2, (A(1), A(1), A(1))),
        (elementwise._tanh_fwd_v2, (A(1), A(1))),
        (elementwise._tanh_bwd_v2, (A(1), A(1), A(1))),
        # im2col (v2_caffe)
        (im2col._im2col_v2, (A(4),) + geo8 + (i64, i64, A(2))),
        (im2col._col2im_v2, (A(2),) + geo8 + (i64, i64, A(4))),
        # pooling (forward v1, backward v2_gather)
        (pooling._max_fwd, (A(4),) + geo6 + (A(4), mask)),
        (pooling._max_bwd_gather, (A(4), mask) + geo6 + (A(4),)),
        (pooling._ave_fwd, (A(4),) + geo6 + (A(4),)),
        (pooling._ave_bwd_gather, (A(4),) + geo6 + (A(4),)),
        # softmax (v3_auto: the block kernels for inner == 1, the thread kernels otherwise)
        (fwd_block, (A(3), A(3))),
        (bwd_block, (A(3), A(3), A(3))),
        (softmax._fwd_thread, (A(3), A(3))),
        (softmax._bwd_thread, (A(3), A(3), A(3))),
        # SoftmaxWithLoss on the device: fused forward (one block, or three launches), backward
        (xent_one, (A(3), A(2), i64, b1, f64, A(3), status, A(1))),
        (softmax._status_init, (status,)),
        (xent_multi, (A(3), A(2), i64, b1, A(3), status)),
        (softmax._status_finish, (status, f64, A(1))),
        (softmax._loss_bwd_dev, (A(3), A(2), i64, b1, A(1), status, A(3))),
        (softmax._loss_bwd, (A(3), A(2), i64, b1, f, A(3))),
        # bias gradients (fused.py)
        (bias, (A(3), A(1))),
        (bias_t, (A(3), A(1), A(2))),
        # the SGD step, with the rate as a number and on the device
        (sgd._sgd_step, (A(1), A(1), A(1), f, f, f)),
        (sgd._sgd_step_dev, (A(1), A(1), A(1), f, A(1), f)),
        (sgd._sgd_step_segments, (A(1), A(1), A(1), A(1, i64), f, A(1), A(1))),
    ]
