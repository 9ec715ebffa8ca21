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

from kernels.cuda import _launch  # noqa: E402

name = "cuda"
xp = cupy
_L = _launch.launcher(simulator=False)
transfers = _L.transfers
to_host = _L.to_host
from_host = _L.from_host
synchronize = _L.synchronize
globals().update(_gpu.bind(_L))


def select_device(index):
    """Make GPU ``index`` current for this thread (CuPy and numba share the primary context)."""
    cupy.cuda.Device(int(index)).use()
