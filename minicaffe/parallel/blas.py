"""How many threads BLAS may use, set at run time without threadpoolctl.

N worker threads that each call a BLAS running T threads make N*T threads on the cores: with
more threads than cores, OpenBLAS's spinning threads slow everything down (on a loaded 2-core
machine a LeNet step went from 34 ms to 300 ms).  So a data-parallel run sets T = cores // N.

OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, when numpy loads it; after that only its C function
``openblas_set_num_threads`` changes the count (for the whole process).  numpy's wheels ship
OpenBLAS under a prefixed name (``scipy_openblas_set_num_threads64_``), so we find the library
numpy loaded in /proc/self/maps and call whichever name it exports, with ctypes.  threadpoolctl
does the same for every BLAS and OpenMP runtime; minicaffe only needs OpenBLAS's two functions, so
it does not depend on it.  Where no OpenBLAS is found (macOS Accelerate, MKL) ``set_threads``
returns False and the caller should set the environment variable before numpy loads.
"""

import ctypes
import os

from kernels import cblas

_NAMES = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)
_lib = {"loaded": False, "set": None, "get": None, "path": None}


def _load():
    if _lib["loaded"]:
        return _lib
    _lib["loaded"] = True
    import numpy  # noqa: F401  (loads its BLAS)

    for path, lib in cblas.openblas_libraries():
        for set_name, get_name in _NAMES:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                _lib["set"], _lib["get"] = getattr(lib, set_name), getattr(lib, get_name)
                _lib["set"].argtypes, _lib["set"].restype = [ctypes.c_int], None
                _lib["get"].argtypes, _lib["get"].restype = [], ctypes.c_int
                _lib["path"] = path
                return _lib
    return _lib


def get_threads():
    """OpenBLAS's thread count now, or None where no OpenBLAS was found."""
    lib = _load()
    return lib["get"]() if lib["get"] else None


def set_threads(n):
    """Let BLAS use ``n`` threads (process-wide); False where it cannot be set at run time."""
    lib = _load()
    if not lib["set"]:
        return False
    lib["set"](max(1, int(n)))
    from kernels import gemm  # its auto version runs its own serial kernels only beside a serial BLAS

    gemm.note_blas_threads(n)
    return True


def allowed_cores():
    """The ids of the cores this process may run on, sorted; [] where that cannot be known."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return []


def pin_thread(core):
    """Bind the calling thread to ``core`` (Linux: the affinity of pid 0 is the calling
    thread's); threads it starts later inherit it.  False where it cannot be done."""
    try:
        os.sched_setaffinity(0, {core})
        return True
    except (AttributeError, OSError):
        return False


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
