"""Devices.  A backend is a small module of flat functions (im2col, gemm, max_pool_fwd, ...)
plus ``xp`` (the array module its blobs live in), ``name``, ``to_host`` and ``from_host``: the
contract, with every signature and its meaning, is written once in ``contract.py``.

- ``cpu``: numpy arrays, the numba @njit kernels of ``kernels/``, GEMM through BLAS.
- ``cuda``: CuPy arrays, the numba.cuda kernels of ``kernels/cuda`` (GEMM through cuBLAS by
  default); needs CuPy and an NVIDIA GPU (``pip install -e ".[cuda]"``).
- ``cudasim``: the same numba.cuda kernels run by numba's CUDA simulator on numpy arrays: the GPU
  code path, checked on any machine (slowly).

``set_mode("gpu")`` (pycaffe's ``set_mode_gpu``) picks ``cudasim`` when NUMBA_ENABLE_CUDASIM=1
-- numba's own switch for its simulator -- and ``cuda`` otherwise; where neither can run it raises
one MinicaffeError saying why (no CuPy, no GPU, simulator already chosen) and how to install.

Layers call ``self.backend.<kernel>(...)`` and ``self.xp.<op>(...)``; they never test which
backend they run on.  The current mode is process-global, as in pycaffe (``set_mode_cpu`` /
``set_mode_gpu``); a Net takes the backend current when it is built.
"""

import importlib

from ..errors import MinicaffeError

BACKENDS = ("cpu", "cudasim", "cuda")
GPU_BACKENDS = ("cudasim", "cuda")
_state = {"mode": "cpu", "device": 0}


def gpu_backend_name():
    """The backend "gpu" means in this process: 'cudasim' if NUMBA_ENABLE_CUDASIM=1, else 'cuda'."""
    from . import _gpu

    return "cudasim" if _gpu.simulator_requested() else "cuda"


def why_not(name):
    """None if backend ``name`` can be used in this process, else the reason (imports nothing
    that would fix numba's CUDA target)."""
    if name == "gpu":
        name = gpu_backend_name()
    if name not in BACKENDS:
        return f"unknown backend '{name}'; known: {', '.join(BACKENDS)}"
    if name in GPU_BACKENDS:
        from . import _gpu

        return _gpu.why_not(name)
    return None


def available(name):
    return why_not(name) is None


def get(name=None):
    """The backend module called ``name`` (default: the current mode; "gpu": see set_mode)."""
    name = name or _state["mode"]
    if name == "gpu":
        name = gpu_backend_name()
    if name not in BACKENDS:
        raise MinicaffeError(f"unknown backend '{name}'; known: {', '.join(BACKENDS)}")
    if name in GPU_BACKENDS:
        from . import _gpu

        _gpu.require(name)  # one clear error instead of an ImportError from deep inside
    mod = importlib.import_module(f"{__name__}.{name}")
    if name == "cuda":
        mod.select_device(_state["device"])
    return mod


def set_mode(name):
    """ "cpu", "cuda", "cudasim", or "gpu" (= cudasim under NUMBA_ENABLE_CUDASIM=1, else cuda)."""
    if name == "gpu":
        name = gpu_backend_name()
    get(name)
    _state["mode"] = name


def mode():
    return _state["mode"]


def set_device(index):
    _state["device"] = int(index)
