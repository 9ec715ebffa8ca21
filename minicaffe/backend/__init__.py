"""Devices.  A backend is a small module of flat functions (im2col, gemm, max_pool_fwd, ...)
plus ``xp`` (the array module its blobs live in) and ``name``.

- ``cpu``: numpy arrays, the numba @njit kernels of ``kernels/``, GEMM through BLAS.

Layers call ``self.backend.<kernel>(...)`` and ``self.xp.<op>(...)``; they never test which
backend they run on.  The current mode is process-global, as in pycaffe (``set_mode_cpu`` /
``set_mode_gpu``); a Net takes the backend current when it is built.
"""
import importlib

from ..errors import MinicaffeError

BACKENDS = ("cpu",)
_state = {"mode": "cpu", "device": 0}


def get(name=None):
    """The backend module called ``name`` (default: the current mode)."""
    name = name or _state["mode"]
    if name not in BACKENDS:
        raise MinicaffeError(f"unknown backend '{name}'; known: {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")


def set_mode(name):
    if name == "gpu":
        raise MinicaffeError("set_mode_gpu: this minicaffe has no GPU backend yet; use set_mode_cpu() "
                             "(the CUDA backend is planned: docs/ARCHITECTURE.md)")
    get(name)
    _state["mode"] = name


def mode():
    return _state["mode"]


def set_device(index):
    _state["device"] = int(index)
