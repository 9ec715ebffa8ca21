"""GEMM: c = alpha * op(a) @ op(b) + beta * c, from a triple loop to within reach of OpenBLAS.

Contract (docs/ARCHITECTURE.md, "Kernels"):

    gemm(trans_a, trans_b, alpha, a, b, beta, c)
    op(a) = a.T if trans_a else a: (M, K);  op(b): (K, N);  c: (M, N), C-contiguous, written
    beta == 0 means c is not read (NaN in c does not leak through), as in BLAS.
    c may overlap a or b (each version copies an input that aliases the output first).

Versions:
  blas           numpy.matmul on OpenBLAS, with out=c so the product lands in c with no
                 temporary (alpha == 1, beta == 0: the engine's common case); transposes are
                 passed to BLAS as flags on views, never copied.  The engine's default.
  v1_naive       for i, j: for p: dot product.  B is walked down a column (stride N): every
                 load a cache miss once N*4 bytes exceed a page, no vectorization.
  v2_reordered   for i, p, j: the inner loop is c[i, :] += a[i, p] * b[p, :], unit stride on
                 b and c, so LLVM vectorizes it (AVX2 FMA).  Still one load and one store of c
                 per FMA, and all of b streams through the cache once per row of a.
  (v3_blocked, v4_micro, v5_prange: the kernel ladder, issue 4 -- see docs/KERNELS.md.)
"""
import numpy as np
from numba import njit

from . import _versions

__all__ = ["gemm", "gemm_reference", "VERSIONS", "DEFAULTS", "use"]


# -- reference (numpy, float64) ----------------------------------------------------------------
def gemm_reference(trans_a, trans_b, alpha, a, b, beta, c):
    """float64 alpha * op(a) @ op(b) + beta * c (c read only when beta != 0)."""
    A = np.asarray(a, dtype=np.float64)
    B = np.asarray(b, dtype=np.float64)
    A = A.T if trans_a else A
    B = B.T if trans_b else B
    out = alpha * np.einsum("ik,kj->ij", A, B)      # not BLAS: an independent summation
    if beta != 0:
        out += beta * np.asarray(c, dtype=np.float64)
    return out


def _ops(trans_a, trans_b, a, b, c):
    """op(a), op(b) as views, with the shapes checked (a ValueError names all three)."""
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    if (A.ndim != 2 or B.ndim != 2 or c.ndim != 2 or A.shape[1] != B.shape[0]
            or c.shape[0] != A.shape[0] or c.shape[1] != B.shape[1]):
        raise ValueError(f"gemm: op(a) {A.shape} @ op(b) {B.shape} does not fit c {c.shape} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    return A, B


# -- vendor baseline ----------------------------------------------------------------------------
def gemm_blas(trans_a, trans_b, alpha, a, b, beta, c):
    A, B = _ops(trans_a, trans_b, a, b, c)
    if beta == 0:
        np.matmul(A, B, out=c)          # numpy buffers an input that overlaps c
        if alpha != 1:
            c *= alpha
    else:
        t = np.matmul(A, B)             # the product first: c may alias a or b
        if alpha != 1:
            t *= alpha
        if beta != 1:
            c *= beta
        c += t


def _numba_gemm(kernel):
    """The Python wrapper around a numba kernel(alpha, A, B, beta, C) on op-views."""
    def gemm(trans_a, trans_b, alpha, a, b, beta, c):
        A, B = _ops(trans_a, trans_b, a, b, c)
        if np.may_share_memory(A, c):
            A = A.copy()
        if np.may_share_memory(B, c):
            B = B.copy()
        kernel(c.dtype.type(alpha), A, B, c.dtype.type(beta), c)
    gemm.kernel = kernel
    gemm.__doc__ = kernel.__doc__
    return gemm


# -- v1: naive ----------------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _gemm_v1_naive(alpha, A, B, beta, C):
    """i, j, p: a dot product per element of C; B walked down its columns."""
    M, K = A.shape
    N = B.shape[1]
    for i in range(M):
        for j in range(N):
            acc = C.dtype.type(0)
            for p in range(K):
                acc += A[i, p] * B[p, j]
            if beta == 0:
                C[i, j] = alpha * acc
            else:
                C[i, j] = alpha * acc + beta * C[i, j]


# -- v2: loop-reordered -------------------------------------------------------------------------
@njit(nogil=True, cache=True, fastmath={"contract"})
def _scale_rows(beta, C):
    if beta == 0:
        C[...] = 0
    elif beta != 1:
        for i in range(C.shape[0]):
            for j in range(C.shape[1]):
                C[i, j] *= beta


@njit(nogil=True, cache=True, fastmath={"contract"})
def _gemm_v2_reordered(alpha, A, B, beta, C):
    """i, p, j: C[i, :] += (alpha * A[i, p]) * B[p, :] -- unit stride on B and C."""
    M, K = A.shape
    N = B.shape[1]
    _scale_rows(beta, C)
    for i in range(M):
        ci = C[i]
        for p in range(K):
            a = alpha * A[i, p]
            bp = B[p]
            for j in range(N):
                ci[j] += a * bp[j]


VERSIONS = {
    "gemm": {
        "blas": gemm_blas,
        "v1_naive": _numba_gemm(_gemm_v1_naive),
        "v2_reordered": _numba_gemm(_gemm_v2_reordered),
    },
}
DEFAULTS = {"gemm": "blas"}
REFERENCES = {"gemm": gemm_reference}

gemm = VERSIONS["gemm"][DEFAULTS["gemm"]]


def use(version):
    """Bind gemm to ``version`` (a key of VERSIONS["gemm"], or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("gemm")
