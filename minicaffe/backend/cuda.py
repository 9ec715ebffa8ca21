"""The ``cuda`` backend: blobs in GPU memory (CuPy arrays), the hand-written numba.cuda kernels of
``kernels/cuda`` launched on CuPy's current stream, cuBLAS for the default GEMM.

* Arrays: every blob's data and diff are CuPy arrays; layers' ``self.xp`` is ``cupy``, so their
  array arithmetic runs as CuPy kernels on the device too.
* Kernels: numba receives the CuPy arrays through ``__cuda_array_interface__`` (zero-copy,
  ``sync=False``) and launches on the stream CuPy is using, so numba kernels and CuPy operations
  are ordered on one stream with no synchronization in between.  ``with
  cupy.cuda.Stream(non_blocking=True): ...`` moves a whole step onto another stream.
* The bus: data crosses only through ``to_host`` / ``from_host`` (counted in ``transfers``), plus
  the scalar reads the engine makes on purpose (the loss; see docs/GPU.md).

Requires CuPy and an NVIDIA GPU (``pip install -e ".[cuda]"``); asking for it elsewhere raises
one MinicaffeError that says which is missing.  Selected by ``set_mode("cuda")`` or
``set_mode_gpu()`` (without NUMBA_ENABLE_CUDASIM=1).
"""

from . import _gpu

_gpu.require("cuda")

import cupy  # noqa: E402

from ._gpu_kernels import (  # noqa: E402, F401  (the contract's functions: see _gpu_kernels.py)
    ave_pool_bwd,
    ave_pool_fwd,
    bias_bwd,
    capture,
    capturing,
    col2im,
    conv_direct,
    conv_direct_bwd_filter,
    conv_direct_fwd,
    from_host,
    gemm,
    im2col,
    launches,
    max_pool_bwd,
    max_pool_fwd,
    precompile,
    relu_bwd,
    relu_fwd,
    sgd_step,
    sgd_step_segments,
    sigmoid_bwd,
    sigmoid_fwd,
    softmax_bwd,
    softmax_fwd,
    softmax_loss_bwd,
    softmax_loss_fwd,
    softmax_xent_fwd,
    synchronize,
    tanh_bwd,
    tanh_fwd,
    to_host,
    transfers,
)

name = "cuda"
xp = cupy
host_lanes = False  # the device runs the whole batch: no lanes (minicaffe/parallel/plan.py)


def select_device(index):
    """Make GPU ``index`` current for this thread (CuPy and numba share the primary context)."""
    cupy.cuda.Device(int(index)).use()
