"""GEMM: c = alpha * op(a) @ op(b) + beta * c, from a triple loop to within reach of OpenBLAS.

Contract (docs/ARCHITECTURE.md, "Kernels"):

    gemm(trans_a, trans_b, alpha, a, b, beta, c)
    op(a) = a.T if trans_a else a: (M, K);  op(b): (K, N);  c: (M, N), C-contiguous, written
    beta == 0 means c is not read (NaN in c does not leak through), as in BLAS.
    c may overlap a or b (each version copies an input that aliases the output first).

Versions:
  blas           OpenBLAS's cblas_sgemm called through ctypes (kernels/cblas.py): alpha, beta
                 and the transposes passed as they are, nothing copied or cleared, the GIL
                 released for the whole call; numpy.dot with out=c where no cblas is found.
                 The vendor baseline.
  v1_naive       for i, j: for p: dot product.  B is walked down a column (stride N): every
                 load a cache miss once N*4 bytes exceed a page, no vectorization.
  v2_reordered   for i, p, j: the inner loop is c[i, :] += a[i, p] * b[p, :], unit stride on
                 b and c, so LLVM vectorizes it (AVX2 FMA).  Still one load and one store of c
                 per FMA, and all of b streams through the cache once per row of a.
  v3_micro       the BLIS loop nest (NC columns of B, KC deep, MC rows of A), both operands
                 packed unit-stride along k (transposes absorbed by the packing), around a 4x3
                 register-blocked micro-kernel in dot-product form: 12 scalar accumulators that
                 LLVM turns into 12 ymm registers, 7 vector loads per 12 FMAs (``python -m
                 kernels.gemm --asm`` prints the loop).  The story in between, folded in here:
                 blocking and packing alone (one vectorized dot product per element of C) stop
                 the fall of speed with size, but each FMA still needs two loads, and that
                 version ran at about half of this one; the register tile is what turns a
                 blocked GEMM into a fast one.  An untransposed B with a short K or few rows of
                 A (im2col's col) goes to a k-unrolled AXPY kernel instead, which needs no
                 transposed packing and no horizontal sums.  ~2/3 of OpenBLAS on one core.
  v4_prange      v3 with the columns of C split across cores in one parallel region (opt-in:
                 numba's workqueue threading layer cannot run two parallel regions at once).
  v5_wide        tiles sized for 32 vector registers (AVX-512, which LLVM uses on such CPUs):
                 the AXPY kernel with eight values of k per pass, and a 5 x 4 dot-product tile
                 (20 accumulators) run straight on the caller's rows when A and B^T both run
                 along k -- no packing.  That second kernel beats OpenBLAS by 1.3-1.6x on the
                 convolutions' weight gradients (k = the batch's pixels) and LeNet's ip1.
  auto           the engine's default: v5's dot-product kernel where it wins (op(b) = b^T,
                 contiguous rows, k >= DOT_MIN_K, AVX-512), ``blas`` everywhere else.
See docs/KERNELS.md for the story and the numbers.
"""

import os
import threading

import numpy as np
from numba import get_num_threads, njit, prange

from . import _versions, cblas

__all__ = ["gemm", "gemm_reference", "check_operands", "vendor_gemm", "VERSIONS", "DEFAULTS", "use"]


# -- reference (numpy, float64) ----------------------------------------------------------------
def gemm_reference(trans_a, trans_b, alpha, a, b, beta, c):
    """float64 alpha * op(a) @ op(b) + beta * c (c read only when beta != 0)."""
    A = np.asarray(a, dtype=np.float64)
    B = np.asarray(b, dtype=np.float64)
    A = A.T if trans_a else A
    B = B.T if trans_b else B
    out = alpha * np.einsum("ik,kj->ij", A, B)  # not BLAS: an independent summation
    if beta != 0:
        out += beta * np.asarray(c, dtype=np.float64)
    return out


def check_operands(trans_a, trans_b, a, b, c):
    """op(a), op(b) as views (no copy), with the shapes checked: a ValueError names all three.
    Shared with the GPU family (kernels/cuda/gemm.py): it touches only .T, .ndim and .shape, so
    numpy and CuPy arrays both pass through."""
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    if (
        A.ndim != 2
        or B.ndim != 2
        or c.ndim != 2
        or A.shape[1] != B.shape[0]
        or c.shape[0] != A.shape[0]
        or c.shape[1] != B.shape[1]
    ):
        raise ValueError(
            f"gemm: op(a) {tuple(A.shape)} @ op(b) {tuple(B.shape)} does not fit c {tuple(c.shape)} "
            f"(trans_a={trans_a}, trans_b={trans_b})"
        )
    return A, B


# -- vendor baseline ----------------------------------------------------------------------------
def vendor_gemm(xp, trans_a, trans_b, alpha, a, b, beta, c):
    """The vendor library through the array module ``xp``: numpy -> OpenBLAS, CuPy -> cuBLAS.
    ``matmul(A, B, out=c)`` with the transposes as views, which both libraries pass to BLAS as
    flags (nothing is copied); both buffer an input that overlaps c.  With beta != 0 the
    product is formed first (c may alias a or b), then c = beta c + alpha t."""
    A, B = check_operands(trans_a, trans_b, a, b, c)
    if beta == 0:
        xp.matmul(A, B, out=c)
        if alpha != 1:
            c *= alpha
    else:
        t = xp.matmul(A, B)
        if alpha != 1:
            t *= alpha
        if beta != 1:
            c *= beta
        c += t


def gemm_blas(trans_a, trans_b, alpha, a, b, beta, c):
    """OpenBLAS: ``cblas_?gemm`` called directly (``kernels/cblas.py``), else ``gemm_dot``.

    The direct call passes alpha, beta and the transposes to BLAS and releases the GIL for the
    whole call; numpy's ``dot`` first clears its output under the GIL and has no beta.  LeNet's
    conv2 column gradient (500 x 2048 per lane), one core: 1.28 vs 1.49 ms per call; two threads
    at once: 1.44 vs 1.55 ms."""
    A, B = check_operands(trans_a, trans_b, a, b, c)
    same = A.dtype == B.dtype == c.dtype
    if same and not (np.may_share_memory(A, c) or np.may_share_memory(B, c)):
        if cblas.gemm(alpha, A, B, beta, c):
            return
    gemm_dot(trans_a, trans_b, alpha, a, b, beta, c)


def gemm_dot(trans_a, trans_b, alpha, a, b, beta, c):
    """OpenBLAS through numpy's ``dot`` (where no cblas is found, or an operand's layout is not
    BLAS's).

    Why dot: numpy's matmul ran some of the layers' products with OpenBLAS's sgemm holding the
    GIL (py-spy --gil --native on two LeNet worker threads: sgemm_kernel sampled under the GIL,
    2.9 ms of each step, the weight-gradient products; the other thread waited).  ``dot`` wraps
    its BLAS call in Py_BEGIN_ALLOW_THREADS.

    numpy has no BLAS call with beta, so ``beta != 0`` (a layer accumulating its weight gradient)
    goes through ``_accumulate``: the product a block of rows at a time into a small scratch
    buffer of this thread's, added into c while it is still in cache."""
    A, B = check_operands(trans_a, trans_b, a, b, c)
    if not (A.dtype == B.dtype == c.dtype) or np.may_share_memory(A, c) or np.may_share_memory(B, c):
        t = np.dot(A, B)  # mixed dtypes, or c overlaps an input: the whole product first, then c
        if alpha != 1:
            t *= alpha
        if beta == 0:
            c[...] = t
            return
        if beta != 1:
            c *= beta
        c += t
        return
    if beta == 0 and c.flags.c_contiguous:
        np.dot(A, B, out=c)
        if alpha != 1:
            c *= alpha
        return
    _accumulate(alpha, A, B, beta, c)


#: elements of the per-thread scratch ``_accumulate`` works in (4 MB of float32: it stays in L2/L3)
ACC_BLOCK = 1 << 20
_acc_local = threading.local()


def _acc_scratch(dtype, n):
    """This thread's scratch of at least n elements of dtype (lanes and workers call gemm at once)."""
    bufs = getattr(_acc_local, "bufs", None)
    if bufs is None:
        bufs = _acc_local.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.size < n:
        buf = bufs[dtype] = np.empty(n, dtype)
    return buf[:n]


def _accumulate(alpha, A, B, beta, c):
    """c = alpha A @ B + beta c (beta may be 0 for a strided c) without an M x N temporary: rows
    r0..r1 of the product go into a scratch of at most ~ACC_BLOCK elements, then into c.  Before,
    ``c += np.dot(A, B)`` allocated (and page-faulted) the whole product on every call: on
    AlexNet's fc6 weight gradient that is 4096 x 9216 floats, 151 MB, each iteration."""
    M, N = c.shape
    rows = max(1, min(M, max(ACC_BLOCK // max(N, 1), 16)))
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        t = _acc_scratch(c.dtype, (r1 - r0) * N).reshape(r1 - r0, N)
        np.dot(A[r0:r1], B, out=t)
        if alpha != 1:
            t *= alpha
        cr = c[r0:r1]
        if beta == 0:
            cr[...] = t
            continue
        if beta != 1:
            cr *= beta
        cr += t


def _numba_gemm(kernel):
    """The Python wrapper around a numba kernel(alpha, a, ta, b, tb, beta, c).

    The kernels take the caller's arrays with the transposes as flags (op(a) = a.T if ta),
    C-contiguous: one compiled specialization per dtype instead of one per layout of each
    operand.  An F-contiguous operand is passed as its (C-contiguous) transpose with the flag
    flipped; any other strided operand, or one that overlaps c, is copied first."""

    def gemm(trans_a, trans_b, alpha, a, b, beta, c):
        check_operands(trans_a, trans_b, a, b, c)
        a, ta = _c_order(a, bool(trans_a), c)
        b, tb = _c_order(b, bool(trans_b), c)
        kernel(c.dtype.type(alpha), a, ta, b, tb, c.dtype.type(beta), c)

    gemm.kernel = kernel
    gemm.__doc__ = kernel.__doc__
    return gemm


def _c_order(x, t, c):
    if np.may_share_memory(x, c):
        return np.array(x, dtype=c.dtype, order="C"), t  # a copy, always
    if x.dtype == c.dtype:
        if x.flags.c_contiguous:
            return x, t
        if x.flags.f_contiguous:
            return x.T, not t
    return np.ascontiguousarray(x, dtype=c.dtype), t


@njit(nogil=True, cache=True)
def _dims(a, ta, b, tb):
    M = a.shape[1] if ta else a.shape[0]
    K = a.shape[0] if ta else a.shape[1]
    N = b.shape[0] if tb else b.shape[1]
    return M, N, K


# -- v1: naive ----------------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _gemm_v1_naive(alpha, a, ta, b, tb, beta, C):
    """i, j, p: a dot product per element of C; B walked down its columns."""
    M, N, K = _dims(a, ta, b, tb)
    for i in range(M):
        for j in range(N):
            acc = C.dtype.type(0)
            for p in range(K):
                acc += (a[p, i] if ta else a[i, p]) * (b[j, p] if tb else b[p, j])
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
def _gemm_v2_reordered(alpha, a, ta, b, tb, beta, C):
    """i, p, j: C[i, :] += (alpha * A[i, p]) * B[p, :] -- unit stride on B and C (when B is
    not transposed: a transposed B is read down its columns, as slowly as v1 does)."""
    M, N, K = _dims(a, ta, b, tb)
    _scale_rows(beta, C)
    for i in range(M):
        ci = C[i]
        for p in range(K):
            x = alpha * (a[p, i] if ta else a[i, p])
            if tb:
                for j in range(N):
                    ci[j] += x * b[j, p]
            else:
                bp = b[p]
                for j in range(N):
                    ci[j] += x * bp[j]


# -- shared by v3, v4: blocking and packing ----------------------------------------------------
# Block sizes (float32 figures; a Zen 3 core has 32 KB L1d, 512 KB L2, a shared 32 MB L3):
#   KC: the depth of one pass; a packed strip of KC float32 values is 2 KB, and the MR + NR
#       strips the micro-kernel reads (14 KB) sit in L1 while it runs.  Deep enough that the
#       12 horizontal sums that end each micro-kernel call cost little next to its KC/8
#       vector iterations.
#   MC: rows of A packed per block (MC*KC*4 = 128 KB: stays in L2 while all of B's strips
#       stream past it).
#   NC: columns of B packed per panel (NC*KC*4 = 2 MB, in L3; each NR-strip is read from
#       there once per MC block and then stays in L1 for the whole block).
KC, MC, NC = 512, 64, 1024
MR, NR = 4, 3  # the register tile: 12 accumulators + 4 A vectors ... of 16 ymm registers


KP = 8  # packed strips are padded with zeros to a multiple of KP along k


@njit(nogil=True, cache=True)
def _pack_rows(X, tx, r0, nr, c0, nc, pad, ncp, out):
    """out[i*ncp + k] = Y[r0 + i, c0 + k] for i < nr, k < nc, where Y = X.T if tx else X:
    rows contiguous along k, each zero-padded to length ncp, plus zero rows up to a multiple
    of ``pad``.  Packing A is this with Y = op(A); packing B is this with Y = op(B).T, so both
    operands of the dot-product micro-kernel run along k with unit stride whatever the
    caller's layout (the transposes are absorbed here, once per block).

    A transposed read walks X's rows (unit stride) for a band of 64 output rows at a time
    and scatters into those 64 rows, which stay in L1 across the whole band.  (The obvious
    tile order, reading 16 rows of X 16 values at a time, ran at 0.24 G values/s for
    N = 4096: a row stride of 16 KB maps all 16 rows onto one L1 set, which has 8 ways.)"""
    if tx:
        B = 64
        for i0 in range(0, nr, B):
            i1 = min(i0 + B, nr)
            for k in range(nc):
                src = X[c0 + k, r0 + i0 : r0 + i1]
                dst = out[i0 * ncp + k : i1 * ncp + k : ncp]
                for ii in range(i1 - i0):
                    dst[ii] = src[ii]
    else:
        for i in range(nr):
            out[i * ncp : i * ncp + nc] = X[r0 + i, c0 : c0 + nc]
    for i in range(nr):
        out[i * ncp + nc : (i + 1) * ncp] = 0
    rows = (nr + pad - 1) // pad * pad
    out[nr * ncp : rows * ncp] = 0


# -- v3: blocked, packed, register-blocked micro-kernel -----------------------------------------
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"}, inline="always")
def _micro_4x3(kc, Ap, ao, Bp, bo, C, i0, j0, m, n, alpha):
    """C[i0:i0+m, j0:j0+n] += alpha * (4 packed A rows) . (3 packed B columns), m <= 4, n <= 3.

    Twelve scalar accumulators; with reassociation allowed LLVM vectorizes the p loop into
    twelve 8-wide (float32) accumulator registers: per 8 values of k, 7 vector loads feed
    12 FMAs, so the loads no longer limit the FMA units (one dot product per element of C:
    2 loads per FMA).  The slices
    make every index provably >= 0, which removes numba's negative-index fix-up from the loop
    (without them LLVM gathers element by element instead of loading vectors)."""
    a0 = Ap[ao : ao + kc]
    a1 = Ap[ao + kc : ao + 2 * kc]
    a2 = Ap[ao + 2 * kc : ao + 3 * kc]
    a3 = Ap[ao + 3 * kc : ao + 4 * kc]
    b0 = Bp[bo : bo + kc]
    b1 = Bp[bo + kc : bo + 2 * kc]
    b2 = Bp[bo + 2 * kc : bo + 3 * kc]
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
    else:  # an edge tile: the packed padding rows were zeros
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
            _micro_4x3(kc, Ap, i * kc, Bp, j * kc, C, ic + i, jc + j, min(MR, mc - i), n, alpha)


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_micro_cols(alpha, a, ta, b, tb, C, j_lo, j_hi):
    """v3's loop nest on the columns [j_lo, j_hi) of B and C, with its own packing buffers."""
    M, N, K = _dims(a, ta, b, tb)
    Ap = np.empty((MC + MR) * KC, C.dtype)
    Bp = np.empty((NC + NR) * KC, C.dtype)
    for jc in range(j_lo, j_hi, NC):
        nc = min(NC, j_hi - jc)
        for pc in range(0, K, KC):
            kc = min(KC, K - pc)
            kp = (kc + KP - 1) // KP * KP
            _pack_rows(b, not tb, jc, nc, pc, kc, NR, kp, Bp)
            for ic in range(0, M, MC):
                mc = min(MC, M - ic)
                _pack_rows(a, ta, ic, mc, pc, kc, MR, kp, Ap)
                _macro(alpha, Ap, mc, Bp, nc, kp, C, ic, jc, 0, (nc + NR - 1) // NR)


# the AXPY kernel (op(B) = B, rows of B contiguous along N): it runs when K is short or M is
# small, where the dot-product form's transposed packing of B is not paid back
KSHORT, MSMALL = 64, 128
NB, KB = 1024, 256  # a pass updates C[4 rows, NB columns] (16 KB) from B[KB rows, NB]


@njit(nogil=True, cache=True, inline="always")
def _av(a, ta, i, p, alpha):
    return alpha * (a[p, i] if ta else a[i, p])


@njit(nogil=True, cache=True, fastmath={"contract"}, inline="always")
def _axpy_block(alpha, a, ta, b, C, j0, j1, p0, p1):
    """C[:, j0:j1] += alpha * op(A)[:, p0:p1] @ B[p0:p1, j0:j1], four rows of C and four
    values of k per pass:

        c_i[j] += x_i0 * b[p, j] + x_i1 * b[p+1, j] + x_i2 * b[p+2, j] + x_i3 * b[p+3, j]

    Each vector load and store of C carries four FMAs, and each load of B four more; there
    are no horizontal sums and nothing is packed.  (With one k per pass -- the textbook
    AXPY -- the store of C limits it to one FMA per cycle: 10 GFLOP/s on LeNet's conv1.)"""
    M = C.shape[0]
    w = j1 - j0
    p4 = p1 - (p1 - p0) % 4
    for i0 in range(0, M, 4):
        r = min(4, M - i0)
        # missing rows (r < 4) repeat the last one: computed, never stored
        i1, i2, i3 = i0 + min(1, r - 1), i0 + min(2, r - 1), i0 + min(3, r - 1)
        c0, c1, c2, c3 = C[i0, j0:j1], C[i1, j0:j1], C[i2, j0:j1], C[i3, j0:j1]
        for p in range(p0, p4, 4):
            b0, b1, b2, b3 = b[p, j0:j1], b[p + 1, j0:j1], b[p + 2, j0:j1], b[p + 3, j0:j1]
            x00, x01 = _av(a, ta, i0, p, alpha), _av(a, ta, i0, p + 1, alpha)
            x02, x03 = _av(a, ta, i0, p + 2, alpha), _av(a, ta, i0, p + 3, alpha)
            x10, x11 = _av(a, ta, i1, p, alpha), _av(a, ta, i1, p + 1, alpha)
            x12, x13 = _av(a, ta, i1, p + 2, alpha), _av(a, ta, i1, p + 3, alpha)
            x20, x21 = _av(a, ta, i2, p, alpha), _av(a, ta, i2, p + 1, alpha)
            x22, x23 = _av(a, ta, i2, p + 2, alpha), _av(a, ta, i2, p + 3, alpha)
            x30, x31 = _av(a, ta, i3, p, alpha), _av(a, ta, i3, p + 1, alpha)
            x32, x33 = _av(a, ta, i3, p + 2, alpha), _av(a, ta, i3, p + 3, alpha)
            if r == 4:
                for j in range(w):
                    u, v, s, t = b0[j], b1[j], b2[j], b3[j]
                    c0[j] += x00 * u + x01 * v + x02 * s + x03 * t
                    c1[j] += x10 * u + x11 * v + x12 * s + x13 * t
                    c2[j] += x20 * u + x21 * v + x22 * s + x23 * t
                    c3[j] += x30 * u + x31 * v + x32 * s + x33 * t
            else:
                for j in range(w):
                    u, v, s, t = b0[j], b1[j], b2[j], b3[j]
                    c0[j] += x00 * u + x01 * v + x02 * s + x03 * t
                if r > 1:
                    for j in range(w):
                        u, v, s, t = b0[j], b1[j], b2[j], b3[j]
                        c1[j] += x10 * u + x11 * v + x12 * s + x13 * t
                if r > 2:
                    for j in range(w):
                        u, v, s, t = b0[j], b1[j], b2[j], b3[j]
                        c2[j] += x20 * u + x21 * v + x22 * s + x23 * t
        for p in range(p4, p1):  # the last (p1 - p0) % 4 values of k
            bp = b[p, j0:j1]
            for i in range(i0, i0 + r):
                x = _av(a, ta, i, p, alpha)
                ci = C[i, j0:j1]
                for j in range(w):
                    ci[j] += x * bp[j]


@njit(nogil=True, cache=True, fastmath={"contract"})
def _gemm_axpy(alpha, a, ta, b, C, j_lo, j_hi):
    """C[:, j_lo:j_hi] += alpha * op(A) @ B (B untransposed) in NB x KB blocks: the B block
    (KB x NB, 1 MB) is read from L2/L3 once per four rows of C, which stay in L1."""
    K = b.shape[0]
    for j0 in range(j_lo, j_hi, NB):
        j1 = min(j0 + NB, j_hi)
        for p0 in range(0, K, KB):
            _axpy_block(alpha, a, ta, b, C, j0, j1, p0, min(p0 + KB, K))


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v3_micro(alpha, a, ta, b, tb, beta, C):
    """The BLIS loop nest (jc, pc: pack B; ic: pack A; jr, ir: micro-kernel) around the
    4x3 register-blocked micro-kernel -- or, for an untransposed B with a short K or few rows
    (im2col's col: LeNet's and CIFAR's convolutions), the AXPY kernel."""
    _scale_rows(beta, C)
    M, N, K = _dims(a, ta, b, tb)
    j_lo = N - N  # (not the literal 0: numba would compile a second specialization)
    if not tb and (K <= KSHORT or M <= MSMALL):
        _gemm_axpy(alpha, a, ta, b, C, j_lo, N)
    else:
        _gemm_micro_cols(alpha, a, ta, b, tb, C, j_lo, N)


# -- v5: register tiles for 32 vector registers -------------------------------------------------
# v3's tiles were sized for AVX2's 16 registers.  With AVX-512 (32 registers, which LLVM also uses
# for 256-bit code), each kernel can carry twice the work per load and store:
#   AXPY form (op(B) = B): four rows of C and EIGHT values of k per pass -- each vector load and
#       store of C now carries eight FMAs, each load of B four;
#   dot-product form (op(B) = B^T with A's and B's rows both along k): a 5 x 4 tile, 20
#       accumulators, 9 vector loads per 20 FMAs; no packing at all, since both operands already
#       run along k (a convolution's weight gradient dY @ col^T: K is the batch's pixels, 2048+).
# On the convolution shapes of LeNet and CIFAR-10 these beat OpenBLAS (docs/KERNELS.md); on large
# square products, where OpenBLAS's packed kernels reach the machine's peak, they do not.
NB5, KB5 = 2048, 64  # AXPY blocks: C[4 rows, NB5] (32 KB) stays in L1; B[KB5, NB5] (512 KB) in L2


@njit(nogil=True, cache=True, fastmath={"contract"})
def _axpy8_block(alpha, a, b, C, j0, j1, p0, p1):
    """C[:, j0:j1] += alpha * A[:, p0:p1] @ B[p0:p1, j0:j1] (A untransposed): ``_axpy_block``
    with eight values of k per pass over four whole rows of C; the last M % 4 rows and
    (p1 - p0) % 8 values of k go to ``_axpy_block``.  A's values are read through slices of its
    rows (indices provably >= 0: no negative-index fix-up around the 32 loads)."""
    M = C.shape[0]
    M4 = M - M % 4
    p8 = p1 - (p1 - p0) % 8
    w = j1 - j0
    for i0 in range(0, M4, 4):
        c0, c1, c2, c3 = C[i0, j0:j1], C[i0 + 1, j0:j1], C[i0 + 2, j0:j1], C[i0 + 3, j0:j1]
        for p in range(p0, p8, 8):
            b0, b1, b2, b3 = b[p, j0:j1], b[p + 1, j0:j1], b[p + 2, j0:j1], b[p + 3, j0:j1]
            b4, b5, b6, b7 = b[p + 4, j0:j1], b[p + 5, j0:j1], b[p + 6, j0:j1], b[p + 7, j0:j1]
            a0, a1, a2, a3 = a[i0, p : p + 8], a[i0 + 1, p : p + 8], a[i0 + 2, p : p + 8], a[i0 + 3, p : p + 8]
            x00, x01, x02, x03 = alpha * a0[0], alpha * a0[1], alpha * a0[2], alpha * a0[3]
            x04, x05, x06, x07 = alpha * a0[4], alpha * a0[5], alpha * a0[6], alpha * a0[7]
            x10, x11, x12, x13 = alpha * a1[0], alpha * a1[1], alpha * a1[2], alpha * a1[3]
            x14, x15, x16, x17 = alpha * a1[4], alpha * a1[5], alpha * a1[6], alpha * a1[7]
            x20, x21, x22, x23 = alpha * a2[0], alpha * a2[1], alpha * a2[2], alpha * a2[3]
            x24, x25, x26, x27 = alpha * a2[4], alpha * a2[5], alpha * a2[6], alpha * a2[7]
            x30, x31, x32, x33 = alpha * a3[0], alpha * a3[1], alpha * a3[2], alpha * a3[3]
            x34, x35, x36, x37 = alpha * a3[4], alpha * a3[5], alpha * a3[6], alpha * a3[7]
            for j in range(w):
                u0, u1, u2, u3, u4, u5, u6, u7 = b0[j], b1[j], b2[j], b3[j], b4[j], b5[j], b6[j], b7[j]
                c0[j] += x00 * u0 + x01 * u1 + x02 * u2 + x03 * u3 + x04 * u4 + x05 * u5 + x06 * u6 + x07 * u7
                c1[j] += x10 * u0 + x11 * u1 + x12 * u2 + x13 * u3 + x14 * u4 + x15 * u5 + x16 * u6 + x17 * u7
                c2[j] += x20 * u0 + x21 * u1 + x22 * u2 + x23 * u3 + x24 * u4 + x25 * u5 + x26 * u6 + x27 * u7
                c3[j] += x30 * u0 + x31 * u1 + x32 * u2 + x33 * u3 + x34 * u4 + x35 * u5 + x36 * u6 + x37 * u7
    if p8 < p1 and M4 > 0:  # the last (p1 - p0) % 8 values of k
        _axpy_block(alpha, a[:M4], False, b, C[:M4], j0, j1, p8, p1)
    if M4 < M:  # the last M % 4 rows
        _axpy_block(alpha, a[M4:], False, b, C[M4:], j0, j1, p0, p1)


@njit(nogil=True, cache=True, fastmath={"contract"})
def _gemm_axpy8(alpha, a, b, C, j_lo, j_hi):
    """C[:, j_lo:j_hi] += alpha * A @ B in NB5 x KB5 blocks of B."""
    K = b.shape[0]
    for j0 in range(j_lo, j_hi, NB5):
        j1 = min(j0 + NB5, j_hi)
        for p0 in range(0, K, KB5):
            _axpy8_block(alpha, a, b, C, j0, j1, p0, min(p0 + KB5, K))


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"}, inline="always")
def _dot_tile_5x4(a0, a1, a2, a3, a4, b0, b1, b2, b3, K):
    """The 5 x 4 tile of dot products dot(a_i[:K], b_j[:K]): 20 accumulators, which with
    reassociation LLVM turns into 20 vector registers (9 vector loads per 20 FMAs); returned as
    five rows of four.  Shared with kernels.conv's direct weight gradient."""
    z = a0.dtype.type(0)
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = s20 = s21 = s22 = s23 = z
    s30 = s31 = s32 = s33 = s40 = s41 = s42 = s43 = z
    for p in range(K):
        u, v, e, f = b0[p], b1[p], b2[p], b3[p]
        x = a0[p]
        s00 += x * u
        s01 += x * v
        s02 += x * e
        s03 += x * f
        x = a1[p]
        s10 += x * u
        s11 += x * v
        s12 += x * e
        s13 += x * f
        x = a2[p]
        s20 += x * u
        s21 += x * v
        s22 += x * e
        s23 += x * f
        x = a3[p]
        s30 += x * u
        s31 += x * v
        s32 += x * e
        s33 += x * f
        x = a4[p]
        s40 += x * u
        s41 += x * v
        s42 += x * e
        s43 += x * f
    return (
        (s00, s01, s02, s03),
        (s10, s11, s12, s13),
        (s20, s21, s22, s23),
        (s30, s31, s32, s33),
        (s40, s41, s42, s43),
    )


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _dots_5x4(alpha, a, b, C, j_lo, j_hi):
    """C[i, j] += alpha * dot(a[i], b[j]) for j in [j_lo, j_hi): rows of a (M, K) and b (N, K)
    both run along k.  Tiles of 5 rows of a x 4 rows of b; edge tiles repeat their last row
    (computed, not stored).  The four rows of b stay in L1 while all of a's row blocks stream
    past them from L2."""
    M, K = a.shape
    for j0 in range(j_lo, j_hi, 4):
        n = min(4, j_hi - j0)
        b0, b1 = b[j0], b[j0 + min(1, n - 1)]
        b2, b3 = b[j0 + min(2, n - 1)], b[j0 + min(3, n - 1)]
        for i0 in range(0, M, 5):
            r = min(5, M - i0)
            a0, a1, a2 = a[i0], a[i0 + min(1, r - 1)], a[i0 + min(2, r - 1)]
            a3, a4 = a[i0 + min(3, r - 1)], a[i0 + min(4, r - 1)]
            tile = _dot_tile_5x4(a0, a1, a2, a3, a4, b0, b1, b2, b3, K)
            for ii in range(r):
                row = C[i0 + ii]
                for jj in range(n):
                    row[j0 + jj] += alpha * tile[ii][jj]


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v5_wide(alpha, a, ta, b, tb, beta, C):
    """The AXPY kernel with eight values of k per pass for an untransposed B (a transposed A is
    copied untransposed first: M*K values against M*N*K multiply-adds); the 5 x 4 dot-product
    kernel, unpacked, when A and B^T both run along k; otherwise v3's packed path."""
    _scale_rows(beta, C)
    M, N, K = _dims(a, ta, b, tb)
    j_lo = N - N
    if not tb:
        _gemm_axpy8(alpha, np.ascontiguousarray(a.T) if ta else a, b, C, j_lo, N)
    elif not ta:
        _dots_5x4(alpha, a, b, C, j_lo, N)
    else:
        _gemm_micro_cols(alpha, a, ta, b, tb, C, j_lo, N)


# -- v4: v3 across cores ----------------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True, fastmath={"reassoc", "contract", "nsz"})
def _gemm_v4_prange_T(alpha, a, ta, b, tb, beta, C, T):
    """v3 with the columns of C split into one contiguous range per thread, in a single
    parallel region (each thread packs its own B columns and its own copy of A: the copies
    are O(M*K) per thread against O(M*N*K/threads) flops).  Opt-in: numba's workqueue
    threading layer cannot run two parallel regions at once."""
    M, N, K = _dims(a, ta, b, tb)
    _scale_rows(beta, C)
    per = (N + T * NR - 1) // (T * NR) * NR  # whole NR-strips per thread
    for t in prange(T):
        j_lo = min(t * per, N)
        j_hi = min(j_lo + per, N)
        if j_hi > j_lo:
            if not tb and (K <= KSHORT or M <= MSMALL):
                _gemm_axpy(alpha, a, ta, b, C, j_lo, j_hi)
            else:
                _gemm_micro_cols(alpha, a, ta, b, tb, C, j_lo, j_hi)


def _gemm_v4_prange(alpha, a, ta, b, tb, beta, C):
    # the thread count is read here: inside the kernel it would stop numba caching it
    _gemm_v4_prange_T(alpha, a, ta, b, tb, beta, C, get_num_threads())


# -- auto: the engine's default -------------------------------------------------------------------
#: shortest k for which v5's dot-product kernel runs in place of BLAS (its 20 horizontal sums per
#: tile are paid back over a long k), and whether this CPU has the 32 vector registers its tile
#: needs (AVX-512; with 16 it spills and loses to BLAS)
DOT_MIN_K = 256
#: fewest elements of c for it: on a tiny product (LeNet's ip2, 64 x 10) BLAS is faster
DOT_MIN_C = 4096
#: most bytes of a for it: the kernel streams all of a past every four rows of b, so a must stay
#: in L2 (a Zen 4 core's is 1 MB).  Past that BLAS's packing wins: LeNet's conv2 forward with the
#: pixels as rows, a = (2048 x 500) floats = 4 MB, ran at 76 GFLOP/s here against OpenBLAS's 87;
#: conv2's whole-batch weight gradient, a = dY (50 x 4096) = 800 KB, at 79 against 62
DOT_MAX_A = 1 << 20


def _has_avx512():
    try:
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get("avx512f", False))
    except Exception:  # pragma: no cover  (an llvmlite without the query: be conservative)
        return False


WIDE_TILES = _has_avx512()
#: threads OpenBLAS runs: auto's kernel is serial, so it stands in for BLAS only when BLAS runs
#: one thread too (``minicaffe.parallel.blas.set_threads`` reports each change here)
_blas_threads = [int(os.environ.get("OPENBLAS_NUM_THREADS", "0") or 0) or os.cpu_count() or 1]


def note_blas_threads(n):
    """Tell ``gemm_auto`` that OpenBLAS now runs ``n`` threads."""
    _blas_threads[0] = max(1, int(n))


def gemm_auto(trans_a, trans_b, alpha, a, b, beta, c):
    """BLAS, except where v5's unpacked dot-product kernel measured faster than OpenBLAS: op(b) =
    b^T with a and b both C-contiguous and running along a long k (a convolution's weight
    gradient dY @ col^T, an inner product's X @ W^T), on a CPU with 32 vector registers, while
    BLAS runs one thread (a lane's or a worker's GEMMs; with more, BLAS's threads win).  On
    LeNet's conv2 weight gradient (50 x 500, k = 2048 per lane) 99 against OpenBLAS's 64 GFLOP/s
    (docs/KERNELS.md); c, beta and alpha as every version takes them."""
    if (
        WIDE_TILES
        and _blas_threads[0] == 1
        and trans_b
        and not trans_a
        and a.ndim == b.ndim == c.ndim == 2
        and a.shape[1] >= DOT_MIN_K
        and c.size >= DOT_MIN_C
        and a.nbytes <= DOT_MAX_A
        and a.dtype == b.dtype == c.dtype
        and c.dtype in (np.float32, np.float64)
        and a.flags.c_contiguous
        and b.flags.c_contiguous
        and c.flags.c_contiguous
        and not np.may_share_memory(a, c)
        and not np.may_share_memory(b, c)
    ):
        check_operands(trans_a, trans_b, a, b, c)
        _gemm_v5_wide(c.dtype.type(alpha), a, False, b, True, c.dtype.type(beta), c)
        return
    gemm_blas(trans_a, trans_b, alpha, a, b, beta, c)


VERSIONS = {
    "gemm": {
        "blas": gemm_blas,
        "v1_naive": _numba_gemm(_gemm_v1_naive),
        "v2_reordered": _numba_gemm(_gemm_v2_reordered),
        "v3_micro": _numba_gemm(_gemm_v3_micro),
        "v4_prange": _numba_gemm(_gemm_v4_prange),
        "v5_wide": _numba_gemm(_gemm_v5_wide),
        "auto": gemm_auto,
    },
}
DEFAULTS = {"gemm": "auto"}
REFERENCES = {"gemm": gemm_reference}

gemm = VERSIONS["gemm"][DEFAULTS["gemm"]]


def use(version):
    """Bind gemm to ``version`` (a key of VERSIONS["gemm"], or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("gemm")


# -- self-check and benchmark: python -m kernels.gemm --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.gemm``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import gemm as G

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(0)
    sizes = sizes or ([128, 512] if quick else [128, 256, 512, 1024, 2048])
    shapes = [(f"square {n}", n, n, n, False, False) for n in sizes]
    shapes += [
        ("LeNet conv1 fwd  W@col", 20, 36864, 25, False, False),
        ("LeNet conv2 fwd  W@col", 50, 4096, 500, False, False),
        ("LeNet conv2 dW   dY@col^T", 50, 500, 4096, False, True),
        ("LeNet conv2 dcol W^T@dY", 500, 4096, 50, True, False),
        ("LeNet ip1 fwd    X@W^T", 64, 500, 800, False, True),
        ("LeNet ip2 fwd    X@W^T", 64, 10, 500, False, True),
        ("LeNet ip1 dW     dY^T@X", 500, 800, 64, True, False),
    ]
    if not quick:
        shapes += [
            ("CIFAR conv1 fwd  W@col", 32, 102400, 75, False, False),
            ("CIFAR conv2 fwd  W@col", 32, 25600, 800, False, False),
            ("CIFAR conv3 fwd  W@col", 64, 6400, 800, False, False),
            ("CIFAR ip1 fwd    X@W^T", 100, 64, 1024, False, True),
        ]
    cases = []
    for name, M, N, K, ta, tb in shapes:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(F32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(F32)
        c = np.empty((M, N), F32)
        # the reference for big squares costs seconds: check them on a corner block instead
        ref = G.gemm_reference(ta, tb, 1.0, a, b, 0.0, None) if M * N * K <= 3e8 else None

        def run(fn, a=a, b=b, c=c, ta=ta, tb=tb):
            return lambda: fn(ta, tb, 1.0, a, b, 0.0, c)

        def check(fn, a=a, b=b, c=c, ta=ta, tb=tb, ref=ref, K=K):
            if ref is None:
                A = a.T if ta else a
                B = b.T if tb else b
                r = A[:64].astype(np.float64) @ B[:, :64].astype(np.float64)
                close(c[:64, :64], r, sum_tol(K, np.abs(A[:64]) @ np.abs(B[:, :64])), "gemm")
            else:
                close(c, ref, sum_tol(K, G.gemm_reference(ta, tb, 1.0, np.abs(a), np.abs(b), 0.0, None)), "gemm")

        cases.append(
            Case(
                "gemm",
                "gemm",
                f"{name} ({M}x{N}x{K})",
                "compute",
                2.0 * M * N * K,
                4.0 * (M * K + K * N + M * N),
                run,
                check,
                baseline=run(G.gemm_blas),
            )
        )
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("gemm"))
