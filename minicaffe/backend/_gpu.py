"""The checks that say why a GPU backend cannot load (imported before numba's CUDA target is
fixed, so nothing here imports ``numba.cuda``).  The kernel functions the two GPU backends share
are in ``_gpu_kernels.py``.

numba decides ONCE per process, at the first ``import numba.cuda``, whether ``numba.cuda`` is the
real CUDA target or the simulator (``NUMBA_ENABLE_CUDASIM=1``).  So a process can run ``cuda`` or
``cudasim``, never both; the checks below say so instead of failing inside numba.
"""

import os
import sys

from ..errors import MinicaffeError

INSTALL = (
    'pip install -e ".[cuda]" for a CUDA 13 driver, ".[cuda12]" for CUDA 12 (CuPy and numba-cuda); '
    "python -m minicaffe.gpu_check says what is missing"
)


def simulator_requested():
    """NUMBA_ENABLE_CUDASIM=1 in the environment: numba's own switch for its simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def _numba_cuda_mode():
    """None if numba.cuda is not imported yet, else "simulator" or "real"."""
    if "numba.cuda" not in sys.modules:
        return None
    from numba.core import config

    return "simulator" if config.ENABLE_CUDASIM else "real"


def why_not(name):
    """None if backend ``name`` ('cuda' or 'cudasim') can load in this process, else the reason
    (checked without importing numba.cuda, so asking does not fix the process's CUDA target)."""
    mode = _numba_cuda_mode()
    if name == "cudasim":
        if mode is None and os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip() == "0":
            return (
                "NUMBA_ENABLE_CUDASIM=0 is set: this process asked numba for its real CUDA "
                "target, and numba picks real-or-simulator once per process"
            )
        if mode == "real":
            return (
                "numba's real CUDA target is already loaded in this process, and numba picks "
                "real-or-simulator once per process: set NUMBA_ENABLE_CUDASIM=1 before starting "
                "Python to use the simulator"
            )
        return None
    if name != "cuda":
        return f"'{name}' is not a GPU backend"
    if mode == "simulator" or (mode is None and simulator_requested()):
        return (
            "this process already runs numba's CUDA simulator (chosen by NUMBA_ENABLE_CUDASIM=1 "
            "or by loading the cudasim backend), and numba picks real-or-simulator once per "
            "process: start a new process without NUMBA_ENABLE_CUDASIM for the cuda backend"
        )
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e}); install the GPU extra: {INSTALL}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError, or a missing driver library
        return f"CuPy is installed but sees no usable NVIDIA GPU ({type(e).__name__}: {e})"
    if n < 1:
        return "CuPy is installed but there is no NVIDIA GPU on this machine"
    return None


def require(name):
    reason = why_not(name)
    if reason is not None:
        hint = (
            (
                "; without a GPU, NUMBA_ENABLE_CUDASIM=1 makes the GPU mode run the same kernels in "
                "numba's CUDA simulator (slow: for testing)"
            )
            if name == "cuda"
            else ""
        )
        raise MinicaffeError(f"the {name} backend cannot be used: {reason}{hint}")
    if name == "cudasim" and _numba_cuda_mode() is None:
        # Asking for the simulator is asking numba for it: the switch numba reads when
        # numba.cuda is first imported (what NUMBA_ENABLE_CUDASIM=1 would have set).
        from numba.core import config

        config.ENABLE_CUDASIM = 1
