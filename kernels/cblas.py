"""OpenBLAS's ``cblas_sgemm`` / ``cblas_dgemm``, called through ctypes.

numpy's ``dot`` reaches the same function, but on its way it fills the whole output with zeros
(``memset``) while it still holds the GIL, and it has no ``beta``: conv2's column gradient in
LeNet (500 x 2048 floats per lane) is 4 MB cleared for nothing on every call, with the other
lanes and workers locked out of Python meanwhile.  A ctypes call releases the GIL for the whole
call and passes alpha, beta, the transposes and the leading dimensions to BLAS as they are, so
nothing is cleared, copied or allocated.

numpy's wheels ship OpenBLAS under a prefixed name with 64-bit integers
(``scipy_cblas_sgemm64_``); a distribution's numpy links a plain ``cblas_sgemm``.  The library is
the one numpy loaded, found in /proc/self/maps (``minicaffe/parallel/blas.py`` sets its thread
count the same way).  Where none is found (macOS Accelerate, MKL, another OS) ``gemm`` returns
False and the caller goes through numpy.
"""

import ctypes
import re

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_NAMES = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "scipy_cblas_{}gemm", "cblas_{}gemm")
_found = {}  # numpy dtype -> (ctypes function, largest int it takes), or None


def openblas_libraries():
    """(path, ctypes handle) of each OpenBLAS library this process has loaded (numpy's)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", f.read())))
    except OSError:
        return []
    libs = []
    for path in paths:
        try:
            libs.append((path, ctypes.CDLL(path)))  # CDLL: the GIL is released during every call
        except OSError:
            continue
    return libs


def _function(dtype):
    if dtype in _found:
        return _found[dtype]
    _found[dtype] = None
    char = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}.get(dtype)
    real = ctypes.c_float if char == "s" else ctypes.c_double
    for _, lib in openblas_libraries() if char else []:
        for name in _NAMES:
            fn = getattr(lib, name.format(char), None)
            if fn is None:
                continue
            integer = ctypes.c_int64 if name.endswith("64_") else ctypes.c_int
            p, i = ctypes.c_void_p, integer
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i, i, i, real, p, i, p, i, real, p, i]
            fn.restype = None
            _found[dtype] = (fn, 2 ** (8 * ctypes.sizeof(integer) - 1) - 1)
            return _found[dtype]
    return None


def available(dtype):
    """Whether this process has a cblas GEMM for ``dtype`` (float32, float64)."""
    return _function(np.dtype(dtype)) is not None


def _layout(x):
    """(transpose flag, leading dimension) of a 2-D operand BLAS can read in place, else None:
    rows of unit stride (as stored), or columns of unit stride (the transpose of a row-major
    matrix, passed as a flag)."""
    r, c = x.shape
    size = x.itemsize
    s0, s1 = x.strides
    if (c == 1 or s1 == size) and s0 % size == 0 and (r == 1 or s0 // size >= c):
        return NO_TRANS, max(s0 // size if r > 1 else c, c, 1)
    if (r == 1 or s0 == size) and s1 % size == 0 and (c == 1 or s1 // size >= r):
        return TRANS, max(s1 // size if c > 1 else r, r, 1)
    return None


def gemm(alpha, A, B, beta, c):
    """c = alpha A @ B + beta c with one BLAS call; True when done, False when this process has
    no cblas for c's dtype or an operand is not laid out as BLAS needs (the caller goes on).
    A, B, c share one dtype and do not overlap (the caller checks); c's rows are unit stride."""
    found = _function(c.dtype)
    if found is None or c.size == 0 or A.shape[1] == 0:
        return False
    fn, biggest = found
    la, lb, lc = _layout(A), _layout(B), _layout(c)
    if la is None or lb is None or lc is None or lc[0] != NO_TRANS or not c.flags.writeable:
        return False
    (M, K), N = A.shape, c.shape[1]
    if max(M, N, K, la[1], lb[1], lc[1]) > biggest:
        return False
    fn(ROW_MAJOR, la[0], lb[0], M, N, K, alpha, A.ctypes.data, la[1], B.ctypes.data, lb[1], beta, c.ctypes.data, lc[1])
    return True
