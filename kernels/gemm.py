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
from numba import get_num_threads, njit, prange

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


# -- shared by v3..v5: blocking and packing ----------------------------------------------------
# Block sizes (float32 figures; a Zen 3 core has 32 KB L1d, 512 KB L2, a shared 32 MB L3):
#   KC: the depth of one pass; a packed strip of KC values of one row is 1 KB, and MR + NR
#       strips (7 KB) sit in L1 while the micro-kernel runs.
#   MC: rows of A packed per block (MC*KC*4 = 64 KB: stays in L2 while all of B's strips
#       stream past it).
#   NC: columns of B packed per panel (NC*KC*4 = 1 MB, in L3; each NR-strip is read from
#       there once per MC block).
KC, MC, NC = 256, 64, 1024
MR, NR = 4, 3      # the register tile: 12 accumulators + 4 A vectors ... of 16 ymm registers


KP = 8             # packed strips are padded with zeros to a multiple of KP along k


@njit(nogil=True, cache=True)
def _pack_rows(X, r0, nr, c0, nc, pad, ncp, out):
    """out[i*ncp + k] = X[r0 + i, c0 + k] for i < nr, k < nc: rows contiguous along k, each
    zero-padded to length ncp, plus zero rows up to a multiple of ``pad``.  Packing A is this
    with X = op(A); packing B is this with X = op(B).T, so both operands of the dot-product
    micro-kernel run along k with unit stride whatever the caller's strides (transposes are
    absorbed here).  Copied in 16x16 tiles, so that a transposed read (X = B.T of a row-major
    B) touches 16 rows of B per tile instead of a new cache line and page for every value."""
    T = 16
    for i0 in range(0, nr, T):
        i1 = min(i0 + T, nr)
        for k0 in range(0, nc, T):
            k1 = min(k0 + T, nc)
            for i in range(i0, i1):
                o = out[i * ncp:(i + 1) * ncp]
                for k in range(k0, k1):
                    o[k] = X[r0 + i, c0 + k]
        for i in range(i0, i1):
            out[i * ncp + nc:(i + 1) * ncp] = 0
    rows = (nr + pad - 1) // pad * pad
    out[nr * ncp:rows * ncp] = 0


# -- v3: blocked + packed, one dot product per element of C ------------------------------------
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v3_blocked(alpha, A, B, beta, C):
    """v2's arithmetic on packed, cache-sized blocks: each C element is one contiguous dot
    product of a packed A row and a packed B column (vectorized along k thanks to
    fastmath's reassociation), both read from L1/L2 instead of memory.  Two loads per FMA:
    about half of the core's FMA rate at best."""
    M, K = A.shape
    N = B.shape[1]
    _scale_rows(beta, C)
    Bt = B.T
    Ap = np.empty(MC * KC, C.dtype)
    Bp = np.empty(NC * KC, C.dtype)
    for jc in range(0, N, NC):
        nc = min(NC, N - jc)
        for pc in range(0, K, KC):
            kc = min(KC, K - pc)
            _pack_rows(Bt, jc, nc, pc, kc, 1, kc, Bp)
            for ic in range(0, M, MC):
                mc = min(MC, M - ic)
                _pack_rows(A, ic, mc, pc, kc, 1, kc, Ap)
                for i in range(mc):
                    a = Ap[i * kc:(i + 1) * kc]
                    ci = C[ic + i]
                    for j in range(nc):
                        b = Bp[j * kc:(j + 1) * kc]
                        acc = C.dtype.type(0)
                        for p in range(kc):
                            acc += a[p] * b[p]
                        ci[jc + j] += alpha * acc


# -- v4: register-blocked micro-kernel -----------------------------------------------------------
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"}, inline="always")
def _micro_4x3(kc, Ap, ao, Bp, bo, C, i0, j0, m, n, alpha):
    """C[i0:i0+m, j0:j0+n] += alpha * (4 packed A rows) . (3 packed B columns), m <= 4, n <= 3.

    Twelve scalar accumulators; with reassociation allowed LLVM vectorizes the p loop into
    twelve 8-wide (float32) accumulator registers: per 8 values of k, 7 vector loads feed
    12 FMAs, so the loads no longer limit the FMA units (v3: 2 loads per FMA).  The slices
    make every index provably >= 0, which removes numba's negative-index fix-up from the loop
    (without them LLVM gathers element by element instead of loading vectors)."""
    a0 = Ap[ao:ao + kc]
    a1 = Ap[ao + kc:ao + 2 * kc]
    a2 = Ap[ao + 2 * kc:ao + 3 * kc]
    a3 = Ap[ao + 3 * kc:ao + 4 * kc]
    b0 = Bp[bo:bo + kc]
    b1 = Bp[bo + kc:bo + 2 * kc]
    b2 = Bp[bo + 2 * kc:bo + 3 * kc]
    z = C.dtype.type(0)
    c00 = c01 = c02 = c10 = c11 = c12 = c20 = c21 = c22 = c30 = c31 = c32 = z
    for p in range(kc):
        x0, x1, x2 = b0[p], b1[p], b2[p]
        y = a0[p]
        c00 += y * x0
        c01 += y * x1
        c02 += y * x2
        y = a1[p]
        c10 += y * x0
        c11 += y * x1
        c12 += y * x2
        y = a2[p]
        c20 += y * x0
        c21 += y * x1
        c22 += y * x2
        y = a3[p]
        c30 += y * x0
        c31 += y * x1
        c32 += y * x2
    if m == 4 and n == 3:
        r = C[i0]
        r[j0] += alpha * c00
        r[j0 + 1] += alpha * c01
        r[j0 + 2] += alpha * c02
        r = C[i0 + 1]
        r[j0] += alpha * c10
        r[j0 + 1] += alpha * c11
        r[j0 + 2] += alpha * c12
        r = C[i0 + 2]
        r[j0] += alpha * c20
        r[j0 + 1] += alpha * c21
        r[j0 + 2] += alpha * c22
        r = C[i0 + 3]
        r[j0] += alpha * c30
        r[j0 + 1] += alpha * c31
        r[j0 + 2] += alpha * c32
    else:                                  # an edge tile: the packed padding rows were zeros
        _store_row(C[i0], j0, n, alpha, c00, c01, c02)
        if m > 1:
            _store_row(C[i0 + 1], j0, n, alpha, c10, c11, c12)
        if m > 2:
            _store_row(C[i0 + 2], j0, n, alpha, c20, c21, c22)
        if m > 3:
            _store_row(C[i0 + 3], j0, n, alpha, c30, c31, c32)


@njit(nogil=True, cache=True, inline="always")
def _store_row(r, j0, n, alpha, x0, x1, x2):
    r[j0] += alpha * x0
    if n > 1:
        r[j0 + 1] += alpha * x1
    if n > 2:
        r[j0 + 2] += alpha * x2


@njit(nogil=True, cache=True, inline="always")
def _macro(alpha, Ap, mc, Bp, nc, kc, C, ic, jc, jr_lo, jr_hi):
    """All micro-tiles of one packed (mc x kc) A block times the NR-strips jr_lo..jr_hi of a
    packed (nc x kc) B panel.  The B strip (3 KB) stays in L1 while the A block streams past
    it from L2."""
    for jr in range(jr_lo, jr_hi):
        j = jr * NR
        n = min(NR, nc - j)
        for i in range(0, mc, MR):
            _micro_4x3(kc, Ap, i * kc, Bp, j * kc, C, ic + i, jc + j, min(MR, mc - i), n,
                       alpha)


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v4_cols(alpha, A, B, C, j_lo, j_hi):
    """v4's loop nest on the columns [j_lo, j_hi) of B and C, with its own packing buffers."""
    M, K = A.shape
    Bt = B.T
    Ap = np.empty((MC + MR) * KC, C.dtype)
    Bp = np.empty((NC + NR) * KC, C.dtype)
    for jc in range(j_lo, j_hi, NC):
        nc = min(NC, j_hi - jc)
        for pc in range(0, K, KC):
            kc = min(KC, K - pc)
            kp = (kc + KP - 1) // KP * KP
            _pack_rows(Bt, jc, nc, pc, kc, NR, kp, Bp)
            for ic in range(0, M, MC):
                mc = min(MC, M - ic)
                _pack_rows(A, ic, mc, pc, kc, MR, kp, Ap)
                _macro(alpha, Ap, mc, Bp, nc, kp, C, ic, jc, 0, (nc + NR - 1) // NR)


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v4_micro(alpha, A, B, beta, C):
    """The BLIS loop nest (jc, pc: pack B; ic: pack A; jr, ir: micro-kernel) around the
    4x3 register-blocked micro-kernel."""
    _scale_rows(beta, C)
    _gemm_v4_cols(alpha, A, B, C, 0, B.shape[1])


# -- v5: v4 across cores ----------------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v5_prange_T(alpha, A, B, beta, C, T):
    """v4 with the columns of C split into one contiguous range per thread, in a single
    parallel region (each thread packs its own B columns and its own copy of A: the copies
    are O(M*K) per thread against O(M*N*K/threads) flops).  Opt-in: numba's workqueue
    threading layer cannot run two parallel regions at once."""
    N = B.shape[1]
    _scale_rows(beta, C)
    per = (N + T * NR - 1) // (T * NR) * NR          # whole NR-strips per thread
    for t in prange(T):
        j_lo = min(t * per, N)
        j_hi = min(j_lo + per, N)
        if j_hi > j_lo:
            _gemm_v4_cols(alpha, A, B, C, j_lo, j_hi)


def _gemm_v5_prange(alpha, A, B, beta, C):
    # the thread count is read here: inside the kernel it would stop numba caching it
    _gemm_v5_prange_T(alpha, A, B, beta, C, get_num_threads())


VERSIONS = {
    "gemm": {
        "blas": gemm_blas,
        "v1_naive": _numba_gemm(_gemm_v1_naive),
        "v2_reordered": _numba_gemm(_gemm_v2_reordered),
        "v3_blocked": _numba_gemm(_gemm_v3_blocked),
        "v4_micro": _numba_gemm(_gemm_v4_micro),
        "v5_prange": _numba_gemm(_gemm_v5_prange),
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
