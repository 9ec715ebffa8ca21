"""The ``cudasim`` backend: the GPU backend's kernels run by numba's CUDA simulator, on numpy arrays.

Every ``@cuda.jit`` kernel of ``kernels/cuda`` runs here exactly as written -- each CUDA thread a
Python thread, shared memory and ``syncthreads`` emulated -- so the ordinary test run checks the
GPU code path on a machine with no GPU.  It proves correctness, not speed: a launch costs about a
millisecond per simulated thread, so the launcher starts few of them (kernels grid-stride).

What differs from ``cuda`` (and nothing else does): device arrays are ``SimArray`` (numpy storage
that, like a CuPy array, refuses implicit conversion to numpy and any mixing with numpy arrays:
``kernels/cuda/simarray.py``), and kernels are handed them as the simulator's device arrays.  ``to_host``/``from_host`` copy,
as they must on a GPU, and are counted in ``transfers``.

Selected by ``set_mode("cudasim")``, or by ``set_mode_gpu()`` when ``NUMBA_ENABLE_CUDASIM=1``.
Asking for it before anything imported ``numba.cuda`` switches numba to its simulator for the
rest of the process (see ``_gpu.py``).
"""

from . import _gpu

_gpu.require("cudasim")

from ._gpu_kernels import L as _launcher  # noqa: E402
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

name = "cudasim"
#: numpy's namespace on simulated device arrays, which refuse implicit conversion to numpy as
#: CuPy's do (kernels/cuda/simarray.py)
xp = _launcher.xp
host_lanes = False  # the device runs the whole batch: no lanes (minicaffe/parallel/plan.py)
