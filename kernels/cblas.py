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

Two ways in, one function.  ctypes converts fourteen arguments and reads three ``.ctypes.data``
under the GIL: 6-12 us per call, the largest single line holding the GIL in a two-worker LeNet
step.  Where the library takes 64-bit integers (numpy's wheels) the call is made from compiled
code instead: ``_gemm_nogil`` is ``@njit(nogil=True)``, checks the shapes and works out the
layouts from the strides itself, and calls BLAS through a numba ``ExternalFunction``; only
numba's unboxing of the arguments holds the GIL (about 0.5 us).  The function is named, not
baked in by address: its address is registered with LLVM under the name ``minicaffe_sgemm64``
(``llvmlite.binding.add_symbol``) before the first call, so the compiled code is cached on disk
like every other kernel (a new process links the cached code against the name).  A library with
32-bit integers keeps the ctypes call.
"""

import ctypes
import re

import numpy as np
from numba import njit, types

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_NAMES = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "scipy_cblas_{}gemm", "cblas_{}gemm")
_found = {}  # numpy dtype -> (ctypes function, largest int it takes), or None
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# cblas_?gemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) with 64-bit
# integers, by the names nogil_available() registers; the enums are C ints
_I, _P = types.int64, types.voidptr
_sgemm64 = types.ExternalFunction(
    "minicaffe_sgemm64",
    types.void(types.intc, types.intc, types.intc, _I, _I, _I, types.float32, _P, _I, _P, _I, types.float32, _P, _I),
)
_dgemm64 = types.ExternalFunction(
    "minicaffe_dgemm64",
    types.void(types.intc, types.intc, types.intc, _I, _I, _I, types.float64, _P, _I, _P, _I, types.float64, _P, _I),
)
_linked_state = []  # [True] once both names are registered, [False] where they cannot be


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
    """(transpose flag, leading dimension) of a 2-D operand BLAS can read in place, else None."""
    flag, ld = _layout_of(x.shape[0], x.shape[1], x.strides[0], x.strides[1], x.itemsize)
    return None if flag == 0 else (flag, ld)


@njit(nogil=True, cache=True)
def _layout_of(r, c, s0, s1, size):
    """(transpose flag, leading dimension) of an r x c operand with byte strides s0, s1 that BLAS
    can read in place: rows of unit stride (as stored), or columns of unit stride (the transpose
    of a row-major matrix, passed as a flag); (0, 0) for any other layout."""
    if (c == 1 or s1 == size) and s0 % size == 0 and (r == 1 or s0 // size >= c):
        return NO_TRANS, max(s0 // size if r > 1 else c, c, 1)
    if (r == 1 or s0 == size) and s1 % size == 0 and (c == 1 or s1 // size >= r):
        return TRANS, max(s1 // size if c > 1 else r, r, 1)
    return 0, 0


@njit(nogil=True, cache=True)
def _gemm_nogil(alpha, A, B, beta, c):
    """c = alpha A @ B + beta c by cblas_?gemm, all of it without the GIL: 1 done, 0 declined
    (empty, or an operand BLAS cannot read in place), -1 the shapes do not fit.  A, B and c
    share one dtype, float32 or float64 (the caller checks: the pointers carry no type)."""
    M, K = A.shape
    N = c.shape[1]
    if B.shape[0] != K or B.shape[1] != N or c.shape[0] != M:
        return -1
    if M == 0 or N == 0 or K == 0:
        return 0
    size = c.itemsize
    ta, lda = _layout_of(M, K, A.strides[0], A.strides[1], size)
    tb, ldb = _layout_of(K, N, B.strides[0], B.strides[1], size)
    tc, ldc = _layout_of(M, N, c.strides[0], c.strides[1], size)
    if ta == 0 or tb == 0 or tc != NO_TRANS:
        return 0
    if size == 4:
        a32, b32 = np.float32(alpha), np.float32(beta)
        _sgemm64(ROW_MAJOR, ta, tb, M, N, K, a32, A.ctypes.data, lda, B.ctypes.data, ldb, b32, c.ctypes.data, ldc)
    else:
        _dgemm64(ROW_MAJOR, ta, tb, M, N, K, alpha, A.ctypes.data, lda, B.ctypes.data, ldb, beta, c.ctypes.data, ldc)
    return 1


def nogil_available():
    """Whether ``_gemm_nogil`` can run here: numpy's OpenBLAS has both GEMMs with 64-bit
    integers, and their addresses are registered under the names the compiled code calls."""
    if not _linked_state:
        found = [_function(dt) for dt in _DTYPES]
        ok = all(f is not None and f[1] == 2**63 - 1 for f in found)
        if ok:
            import llvmlite.binding as llvm

            for (fn, _), name in zip(found, ("minicaffe_sgemm64", "minicaffe_dgemm64")):
                llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)
        _linked_state.append(ok)
    return _linked_state[0]


def preload_prepare():
    """minicaffe/memory/preload.py calls this before it loads kernels of a run from numba's cache:
    code calling ``_gemm_nogil`` (here and in kernels/winograd.py) links against the names
    registered above, and loading it where they are not registered aborts the process."""
    return nogil_available()


def gemm(alpha, A, B, beta, c):
    """c = alpha A @ B + beta c with one BLAS call; True when done, False when this process has
    no cblas for c's dtype, A and B are not of c's dtype, c is read-only, or an operand is not
    laid out as BLAS needs (the caller goes on).  A, B, c are matrices that do not overlap (the
    caller checks); operands that do not fit raise ValueError."""
    if not _one_dtype(A, B, c):
        return False
    if nogil_available():
        done = _gemm_nogil(float(alpha), A, B, float(beta), c)
        if done < 0:
            raise ValueError(f"cblas.gemm: A {A.shape} @ B {B.shape} does not fit c {c.shape}")
        return done == 1
    return gemm_ctypes(alpha, A, B, beta, c)


def _one_dtype(A, B, c):
    """A, B and a writable c share float32 or float64 (native byte order); not matrices: raise."""
    if A.ndim != 2 or B.ndim != 2 or c.ndim != 2:
        raise ValueError(f"cblas.gemm: A {A.shape}, B {B.shape} and c {c.shape} must be matrices")
    dtype = c.dtype
    return dtype in _DTYPES and A.dtype == dtype and B.dtype == dtype and c.flags.writeable


def gemm_ctypes(alpha, A, B, beta, c):
    """``gemm`` through ctypes, where the compiled call cannot be made (a cblas with 32-bit
    integers): the same checks in Python, and the GIL held while ctypes converts the arguments."""
    if not _one_dtype(A, B, c):
        return False
    found = _function(c.dtype)
    if A.shape[1] != B.shape[0] or B.shape[1] != c.shape[1] or A.shape[0] != c.shape[0]:
        raise ValueError(f"cblas.gemm: A {A.shape} @ B {B.shape} does not fit c {c.shape}")
    if found is None or c.size == 0 or A.shape[1] == 0:
        return False
    fn, biggest = found
    la, lb, lc = _layout(A), _layout(B), _layout(c)
    if la is None or lb is None or lc is None or lc[0] != NO_TRANS:
        return False
    (M, K), N = A.shape, c.shape[1]
    if max(M, N, K, la[1], lb[1], lc[1]) > biggest:
        return False
    fn(ROW_MAJOR, la[0], lb[0], M, N, K, alpha, A.ctypes.data, la[1], B.ctypes.data, lb[1], beta, c.ctypes.data, lc[1])
    return True
