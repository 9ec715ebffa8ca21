"""Winograd convolution: fewer multiplies per output by transforming tiles (Lavin & Gray 2016).

Contract (stride 1, no dilation, a square r x r kernel; the conv family's other arguments):

    fwd(x, w, bias, ph, pw, y, m, U=None, keep=None, ws=None)
        y = conv(x, w) + bias, as kernels.conv.conv_fwd; ``keep`` receives the transformed input
    bwd(x_shape, dy, w, ph, pw, dx=None, dw=None, m, U=None, kept=None, x=None, beta=0, ws=None)
        dx (OVERWRITTEN) and/or dw (= or += with beta 1) from one transform of dy; dw reads the
        forward's ``kept`` tiles, or transforms x again
    bwd_data(dy, w, ph, pw, dx, m), bwd_filter(x, dy, ph, pw, dw, m)   the two, one at a time
        x (N, C, H, W), w (M, C, r, r), bias (M,) or (0,), y (N, M, OH, OW), OH = H + 2 ph - r + 1;
        m is the output tile's side: F(m x m, r x r) reads (m + r - 1)^2 input values per tile;
        U = filters(w, m) if the caller keeps it; ws a Workspace (temporaries kept across calls).

The idea in one dimension.  Two outputs of a 3-tap correlation, y0 = g0 d0 + g1 d1 + g2 d2 and
y1 = g0 d1 + g1 d2 + g2 d3, take 6 multiplies done directly.  Winograd's F(2, 3) takes 4: it
evaluates the filter's polynomial g(x) = g0 + g1 x + g2 x^2 and a data "polynomial" at 4 points
(here 0, 1, -1 and infinity, where a polynomial's value is its leading coefficient), multiplies
the values pointwise (the 4 multiplies) and interpolates back.  In matrices, for the
correlation of a length-(m + r - 1) input d with an r-tap filter g:

    y = A^T [ (G g) * (B^T d) ]            * elementwise, alpha = m + r - 1 products

where G (alpha x r) evaluates g at the alpha points, A (alpha x m) evaluates a degree m - 1
polynomial there, and B^T is the transpose of the interpolation that recovers a product
polynomial (degree alpha - 1) from its alpha values: B^T = (E^-1)^T, E the alpha x alpha
evaluation matrix.  (Correlation is the transpose of polynomial multiplication, which is why
the interpolation appears transposed on the input side.)  In two dimensions the same matrices
act on both axes of an alpha x alpha tile:

    Y (m x m) = A^T [ (G g G^T) * (B^T d B) ] A

and over C input channels the elementwise products become, at each of the alpha^2 tile
positions ("frequencies") xi, a matrix product over channels:

    Mx[xi] (M, tiles) = U[xi] (M, C) @ V[xi] (C, tiles),   U = G w G^T,  V = B^T d B

so a convolution turns into alpha^2 small GEMMs plus three cheap transforms.  Multiplies per
output per channel pair: alpha^2 / m^2 instead of r^2: F(2x2, 5x5) 36/4 = 9 (against 25),
F(4x4, 5x5) 64/16 = 4, F(4x4, 3x3) 36/16 = 2.25 (against 9).

The price is accuracy.  The points are 0, +-1, +-2, +-1/2 (and infinity), the ones that keep
the transform matrices small; bigger tiles need more points and the entries grow (F(4x4, 5x5)'s
B^T has 5.25), so float32 rounding is amplified.  Measured on LeNet's conv2 shapes (random
normal data): max error / max |y| is 2e-7 for direct float32 sums, 3e-6 for F(2x2, 5x5) and
5e-6 for F(4x4, 5x5) (tests/test_kernels_winograd.py states its bound).  The matrices are
derived here from the points in float64 (``transforms``), not pasted: ``A``, ``G``, ``B^T``
come out exactly as Lavin & Gray's Table 1 for F(2, 3), and the filter's matrix takes the
fractions (G's rows divided by f_j = prod_{l != j} (p_j - p_l)) so that B^T, which touches the
data, has small exact entries.

How this file computes it (the engine's layout, every loop a unit-stride run over tiles):
  1. filters: U (alpha^2, M, C) = (G kron G) (alpha^2, r^2) @ w (M*C, r^2)^T, one GEMM.
  2. input: for a block of tiles and each channel, the block's alpha x alpha tiles are gathered
     into D (alpha, alpha, tiles) (zeros outside the padded image) and transformed on both axes,
     each a few AXPYs over the block's tiles that skip B^T's zeros: V[xi, c, tiles].
  3. products: for each xi, Mx[xi] = U[xi] @ V[xi] by BLAS (kernels.cblas, without the GIL).
  4. output: A^T on both axes (AXPYs over tiles again), bias, and the m x m results scattered
     into y (a partial tile at the right or bottom edge writes only what lies inside).
Steps 2-4, over every block of tiles, are one compiled call (``_fwd_blas``; ``_bwd_blas`` for
the gradients) where BLAS can be called without the GIL: with --workers every release of the
GIL is a point where a thread may have to wait for the other to give it back.
The gradients are these steps transposed and run backwards (``bwd``): each m x m tile of dy is
transformed by A on both axes (alpha x alpha); the data gradient multiplies it by U[xi]^T over
the output channels, transforms by B and adds each tile into dx (tiles overlap by r - 1); the
weight gradient sums Y[xi] @ V[xi]^T over the tiles and returns through G^T . G.
"""

import functools
import math
from fractions import Fraction

import numpy as np
from numba import njit

from . import cblas as _cblas
from . import gemm as _gemm

__all__ = [
    "transforms",
    "supported",
    "tile_for",
    "filters",
    "same_bits",
    "fwd",
    "bwd",
    "bwd_data",
    "bwd_filter",
    "tiles_size",
    "Workspace",
    "block_products_size",
    "reference",
    "roundings",
    "flops",
    "POINTS",
    "TILE_BLOCK",
]

#: the finite interpolation points per alpha = m + r - 1 (infinity is always the last point)
POINTS = {
    4: (0.0, 1.0, -1.0),
    6: (0.0, 1.0, -1.0, 2.0, -2.0),
    8: (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5),
}

#: tiles transformed per block (the block's D, V and Mx stay in L2 for LeNet's conv2)
TILE_BLOCK = 256

#: run a pass's loop over blocks compiled whole (``_fwd_blas``, ``_bwd_blas``) where BLAS is
#: called without the GIL; False: the loop in Python, one kernel call per step (as without cblas).
#: (Their memory, ~1.5 MiB while numba kept every cached kernel's LLVM module parsed, once took
#: the train tool over its budget; minicaffe/memory/jitcode.py now keeps those as bitcode.)
COMPILED_PASSES = True


def _evaluation(points, n):
    """(alpha, n) as exact fractions: row j evaluates a polynomial of degree n - 1 (coefficients
    c_0..c_{n-1}) at point j; the last row is the point at infinity, which reads the leading
    coefficient."""
    E = [[Fraction(p) ** k for k in range(n)] for p in points]
    return E + [[Fraction(0)] * (n - 1) + [Fraction(1)]]


def _inverse(E):
    """The inverse of a square matrix of fractions by Gauss-Jordan elimination: exact, so the
    transforms hold exactly the values the algebra gives (5.25, not 5.249999999999998)."""
    n = len(E)
    A = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(E)]
    for c in range(n):
        p = next(r for r in range(c, n) if A[r][c] != 0)
        A[c], A[p] = A[p], A[c]
        A[c] = [v / A[c][c] for v in A[c]]
        for r in range(n):
            if r != c and A[r][c] != 0:
                A[r] = [v - A[r][c] * u for v, u in zip(A[r], A[c])]
    return [row[n:] for row in A]


@functools.cache
def transforms(m, r):
    """(AT (m, alpha), G (alpha, r), BT (alpha, alpha)) in float64 for F(m, r), derived from the
    points in exact arithmetic: AT and G evaluate the output and filter polynomials, BT is the
    transposed inverse of the evaluation of the degree alpha - 1 product, with each finite
    point's scale f_j = prod_{l != j} (p_j - p_l) moved from BT into G (G's row j divided by
    |f_j|, BT's row j multiplied by it), so that BT, which touches the data, holds small values
    (integers, or quarters with the points +-1/2) and the fractions go to the filters."""
    alpha = m + r - 1
    if alpha not in POINTS:
        raise ValueError(
            f"winograd: F({m}, {r}) needs {alpha} points; this file has them for alpha in {sorted(POINTS)}"
        )
    pts = [Fraction(p) for p in POINTS[alpha]]
    f = [abs(np.prod([p - q for q in pts if q != p])) for p in pts] + [Fraction(1)]
    inv = _inverse(_evaluation(pts, alpha))
    AT = np.array(_evaluation(pts, m), np.float64).T
    G = np.array([[v / f[j] for v in row] for j, row in enumerate(_evaluation(pts, r))], np.float64)
    BT = np.array([[inv[i][j] * f[j] for i in range(alpha)] for j in range(alpha)], np.float64)
    return AT, G, BT


def _rows_of(mat, dtype):
    """A transform as (count, column, value) rows of its nonzeros for ``_axpy_rows``, each row's
    list padded to a multiple of four with zero coefficients (on column 0)."""
    nz = [np.flatnonzero(row) for row in mat]
    cnt = np.array([-(-len(z) // 4) * 4 for z in nz], np.int64)
    col = np.zeros((mat.shape[0], cnt.max()), np.int64)
    val = np.zeros((mat.shape[0], cnt.max()), dtype)
    for k, z in enumerate(nz):
        col[k, : len(z)] = z
        val[k, : len(z)] = mat[k, z]
    return cnt, col, val


@functools.cache
def _sparse(m, r, dtype):
    """The four tile transforms in ``dtype`` for the compiled loops: BT and AT (the forward's
    input and output), A and B (the data gradient's: the forward's transposes); and G kron G
    (float64), the filter transform of a flattened r x r filter."""
    AT, G, BT = transforms(m, r)
    return {
        "BT": _rows_of(BT, dtype),
        "AT": _rows_of(AT, dtype),
        "A": _rows_of(AT.T, dtype),
        "B": _rows_of(BT.T, dtype),
        "GG": np.kron(G, G),
        "GG_" + np.dtype(dtype).name: np.kron(G, G).astype(dtype),
    }


def reference(x, w, ph, pw, m, dy=None, magnitude=False):
    """The algorithm in float64 numpy, all tiles at once: (y, dx, dw), the last two only with dy.
    With ``magnitude`` every matrix, input and filter is taken by absolute value: the result
    bounds what rounding can do, |computed - exact| <= roundings(...) * eps * magnitude, each
    rounding of a sum being at most eps times the sum of its terms' sizes, carried through the
    later (absolute) transforms.  The tests' tolerance."""
    AT, G, BT = transforms(m, w.shape[2])
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    if magnitude:
        AT, G, BT, x, w = (np.abs(v) for v in (AT, G, BT, x, w))
        dy = None if dy is None else np.abs(np.asarray(dy, np.float64))
    N, C, H, W = x.shape
    M, _, r, _ = w.shape
    a = m + r - 1
    OH, OW = H + 2 * ph - r + 1, W + 2 * pw - r + 1
    th, tw, Hq, Wq = _geometry(N, OH, OW, m, r)
    xq = _padded(x, Hq, Wq, ph, pw)
    tiles = np.lib.stride_tricks.sliding_window_view(xq, (a, a), axis=(2, 3))[:, :, ::m, ::m]  # (N, C, th, tw, a, a)
    V = np.einsum("ki,nctuij,lj->nctukl", BT, tiles, BT)
    U = np.einsum("ki,mcij,lj->mckl", G, w, G)
    Y = np.einsum("ki,nmtuij,lj->nmtkul", AT, np.einsum("mckl,nctukl->nmtukl", U, V), AT)
    y = Y.reshape(N, M, th * m, tw * m)[:, :, :OH, :OW]
    if dy is None:
        return y, None, None
    dyq = _padded(np.asarray(dy, np.float64), th * m, tw * m, 0, 0).reshape(N, M, th, m, tw, m)
    Yh = np.einsum("ik,nmtkul,jl->nmtuij", AT.T, dyq, AT.T)  # A dy A^T per tile
    dtiles = np.einsum("ik,nctukl,jl->nctuij", BT.T, np.einsum("mckl,nmtukl->nctukl", U, Yh), BT.T)
    dxq = np.zeros((N, C, Hq, Wq))
    for ty in range(th):  # overlapping tiles: added, one tile position at a time
        for tx in range(tw):
            dxq[:, :, ty * m : ty * m + a, tx * m : tx * m + a] += dtiles[:, :, ty, tx]
    dU = np.einsum("nmtukl,nctukl->mckl", Yh, V)
    dw = np.einsum("ik,mckl,lj->mcij", G.T, dU, G)
    return y, dxq[:, :, ph : ph + H, pw : pw + W], dw


def flops(x_shape, w_shape, ph, pw, m, what):
    """Floating-point operations the compiled kernels do for ``what`` ("fwd", "bwd_data" or
    "bwd_filter"): two per multiply-add of the alpha^2 GEMMs and of the transforms' nonzeros
    (the filters' transform and the weight gradient's G^T dU G included).  Far fewer than the
    direct convolution's 2 N M C r^2 OH OW: the benchmark's rate counts these."""
    N, C, H, W = x_shape
    M, _, r, _ = w_shape
    a = m + r - 1
    th, tw, _, _ = _geometry(N, H + 2 * ph - r + 1, W + 2 * pw - r + 1, m, r)
    T = N * th * tw
    AT, _, BT = transforms(m, r)
    nB, nA = np.count_nonzero(BT), np.count_nonzero(AT)  # the same counts for B and A
    x_in = 2 * a * nB * C * T  # B^T d B, each tile of each input channel
    dy_in = (m + a) * nA * M * T  # A dy A^T, each tile of each output channel
    gemm = a * a * M * C * T
    filt = a * a * r * r * M * C
    macs = {
        "fwd": x_in + gemm + (a + m) * nA * M * T + filt,
        "bwd_data": dy_in + gemm + 2 * a * nB * C * T + filt,
        "bwd_filter": x_in + dy_in + gemm + filt,
    }[what]
    return 2.0 * macs


def roundings(C, M, tiles, m, r):
    """How many roundings a result of the float32 algorithm can collect, for ``reference``'s
    bound: the transforms' sums (at most alpha terms on each axis, twice per side), the
    filters' (r^2 terms), and the GEMMs' sums over channels (forward and data gradient) or
    tiles (weight gradient)."""
    a = m + r - 1
    return 4 * a + r * r + max(C, M, tiles) + 4


def supported(kh, kw, sh, sw, dh, dw, m=4):
    """Whether F(m x m, kh x kw) applies: a square kernel with a derived transform, stride 1 and
    no dilation (the engine falls back to im2col + GEMM otherwise)."""
    return kh == kw and kh in (3, 5) and (sh, sw, dh, dw) == (1, 1, 1, 1) and (m + kh - 1) in POINTS


def tile_for(r):
    """The output tile side the engine uses for an r x r kernel: F(4x4, r x r) for r <= 5 (8x8
    tiles at most), F(2x2, ...) where that would need more points than this file has."""
    return 4 if (4 + r - 1) in POINTS else 2


# -- the compiled loops ------------------------------------------------------------------------
# Offsets are unsigned (``_U``): an int64 index carries numba's negative-index fix-up on every
# access, which keeps LLVM from vectorizing the runs over tiles (kernels/im2col.py, v3_flat).
_U = np.uint64


@njit(nogil=True, cache=True)
def _axpy_rows(cnt, col, val, src, s0, s_step, dst, d0, d_step, L):
    """dst row k = sum over the nonzeros (j, v) of the transform's row k of v * src row j, for
    every row k; rows are runs of L values, row j of src at s0 + j*s_step (dst likewise).  The
    nonzeros come four at a time (``_sparse`` pads each row's list with zero coefficients to a
    multiple of four), so each store of dst carries four multiply-adds and the first four write
    it: no clearing pass, and dst is read and written once per four source rows, not per row."""
    for k in range(cnt.shape[0]):
        d = _U(d0 + k * d_step)
        for q in range(0, cnt[k], 4):
            r0, r1 = _U(s0 + col[k, q] * s_step), _U(s0 + col[k, q + 1] * s_step)
            r2, r3 = _U(s0 + col[k, q + 2] * s_step), _U(s0 + col[k, q + 3] * s_step)
            v0, v1, v2, v3 = val[k, q], val[k, q + 1], val[k, q + 2], val[k, q + 3]
            if q == 0:
                for t in range(_U(L)):
                    dst[d + t] = v0 * src[r0 + t] + v1 * src[r1 + t] + v2 * src[r2 + t] + v3 * src[r3 + t]
            else:
                for t in range(_U(L)):
                    dst[d + t] += v0 * src[r0 + t] + v1 * src[r1 + t] + v2 * src[r2 + t] + v3 * src[r3 + t]


@njit(nogil=True, cache=True)
def _origins(N, C, th, tw, m, Hq, Wq, org):
    """org[t] = where tile t = (image, tile row, tile column) starts in a (N, C, Hq, Wq) array's
    channel 0 (add c * Hq * Wq for channel c)."""
    t = 0
    for n in range(N):
        for ty in range(th):
            for tx in range(tw):
                org[t] = _U(n * C * Hq * Wq + ty * m * Wq + tx * m)
                t += 1


@njit(nogil=True, cache=True)
def _tiles_in(xf, C, Hq, Wq, org, t0, L, g, cnt, col, val, D, E, V):
    """V (a, a, C, L) for tiles t0..t0+L of xf (flat (N, C, Hq, Wq)), with the a x g transform
    (cnt, col, val) applied on both axes of each g x g tile.  Per channel: the tiles are gathered
    into D (g, g, L), one run over the block's tiles per position in the tile, then transformed
    along each tile row into E (g, a, L) and down each column into V."""
    a = cnt.shape[0]
    for c in range(C):
        for i in range(g):
            for j in range(g):
                off = _U(c * Hq * Wq + i * Wq + j)
                d = _U((i * g + j) * L)
                for b in range(_U(L)):
                    D[d + b] = xf[org[t0 + b] + off]
        for i in range(g):  # along the rows: E[i, k] = sum_j T[k, j] D[i, j]
            _axpy_rows(cnt, col, val, D, i * g * L, L, E, i * a * L, L, L)
        for k2 in range(a):  # down the columns: V[k1, k2] = sum_i T[k1, i] E[i, k2]
            _axpy_rows(cnt, col, val, E, k2 * L, a * L, V, (k2 * C + c) * L, a * C * L, L)


@njit(nogil=True, cache=True)
def _tiles_out(Mf, K, a, bias, accumulate, yf, OHq, OWq, org, t0, L, cnt, col, val, Z, O):
    """Tiles t0..t0+L of yf (flat (N, K, OHq, OWq)) from Mf (flat (a, a, K, L)), with the s x a
    transform (cnt, col, val) applied on both axes: per channel along the rows into Z (a, s, L),
    down the columns into O (s, s, L), then one run per position in the tile scattered into y:
    written with the bias added, or (``accumulate``: overlapping tiles) added in."""
    s = cnt.shape[0]
    has_bias = bias.shape[0] > 0
    for ko in range(K):
        for i in range(a):  # Z[i, k2] = sum_j T[k2, j] Mx[i, j, ko]
            _axpy_rows(cnt, col, val, Mf, (i * a * K + ko) * L, K * L, Z, i * s * L, L, L)
        for k2 in range(s):  # O[k1, k2] = sum_i T[k1, i] Z[i, k2]
            _axpy_rows(cnt, col, val, Z, k2 * L, s * L, O, k2 * L, s * L, L)
        bv = bias[ko] if has_bias else O[0] * 0
        for k1 in range(s):
            for k2 in range(s):
                off = _U(ko * OHq * OWq + k1 * OWq + k2)
                o = _U((k1 * s + k2) * L)
                if accumulate:
                    for b in range(_U(L)):
                        yf[org[t0 + b] + off] += O[o + b]
                else:
                    for b in range(_U(L)):
                        yf[org[t0 + b] + off] = O[o + b] + bv


@njit(nogil=True, cache=True)
def _products_blas(U, V, Mx):
    """Mx[xi] = U[xi] @ V[xi] for every xi, one BLAS call each, all without the GIL."""
    for xi in range(V.shape[0]):
        _cblas._gemm_nogil(1.0, U[xi], V[xi], 0.0, Mx[xi])


@njit(nogil=True, cache=True)
def _products_blas_t(U, V, Mx):
    """Mx[xi] = U[xi]^T @ V[xi] for every xi (BLAS reads the transpose as a flag)."""
    for xi in range(V.shape[0]):
        _cblas._gemm_nogil(1.0, U[xi].T, V[xi], 0.0, Mx[xi])


@njit(nogil=True, cache=True)
def _products_nt_blas(Y, V, dU, beta):
    for xi in range(V.shape[0]):
        _cblas._gemm_nogil(1.0, Y[xi], V[xi].T, beta, dU[xi])


@njit(nogil=True, cache=True)
def _fwd_blas(a, xf, C, Hq, Wq, org_in, U, V, keep, M, bias, yf, OHq, OWq, org_out, L, BT, AT, D, E, Mx, Z, O):
    """``fwd``'s loop over the blocks of tiles as one compiled call, the products by BLAS:
    the GIL is released once per pass instead of three times per block (with --workers, each
    time a thread takes the GIL back it may find the other thread holding it and sleep)."""
    T = org_in.shape[0]
    for t0 in range(0, T, L):
        n = min(L, T - t0)
        Vb = V[: a * a * C * n] if keep.size == 0 else keep[a * a * C * t0 : a * a * C * (t0 + n)]
        Mb = Mx[: a * a * M * n]
        _tiles_in(xf, C, Hq, Wq, org_in, t0, n, a, BT[0], BT[1], BT[2], D, E, Vb)
        _products_blas(U, Vb.reshape((a * a, C, n)), Mb.reshape((a * a, M, n)))
        _tiles_out(Mb, M, a, bias, False, yf, OHq, OWq, org_out, t0, n, AT[0], AT[1], AT[2], Z, O)


@njit(nogil=True, cache=True)
def _bwd_blas(
    a, m, yf, M, OHq, OWq, org_dy, C, Hq, Wq, org_x, U, xf, xin, kept, V, dU, dw, beta, GG, L, tr, D, E, Y, Mx, Z, O
):
    """``bwd``'s loop over the blocks of tiles as one compiled call, the products by BLAS (as
    ``_fwd_blas``; ``tr`` = the transforms A, B, BT): dx into ``xf`` (zeroed) unless it is
    empty, dw (flat (M*C, r*r)) unless it is empty, from ``kept`` or else from ``xin``."""
    T = org_dy.shape[0]
    no_bias = yf[:0]
    for t0 in range(0, T, L):
        n = min(L, T - t0)
        Yb = Y[: a * a * M * n]
        _tiles_in(yf, M, OHq, OWq, org_dy, t0, n, m, tr[0][0], tr[0][1], tr[0][2], D, E, Yb)
        Y3 = Yb.reshape((a * a, M, n))
        if xf.size:
            Mb = Mx[: a * a * C * n]
            _products_blas_t(U, Y3, Mb.reshape((a * a, C, n)))
            _tiles_out(Mb, C, a, no_bias, True, xf, Hq, Wq, org_x, t0, n, tr[1][0], tr[1][1], tr[1][2], Z, O)
        if dw.size:
            if kept.size == 0:
                Vb = V[: a * a * C * n]
                _tiles_in(xin, C, Hq, Wq, org_x, t0, n, a, tr[2][0], tr[2][1], tr[2][2], D, E, Vb)
            else:
                Vb = kept[a * a * C * t0 : a * a * C * (t0 + n)]
            _products_nt_blas(Y3, Vb.reshape((a * a, C, n)), dU, 0.0 if t0 == 0 else 1.0)
    if dw.size:
        _cblas._gemm_nogil(1.0, dU.reshape((a * a, M * C)).T, GG, beta, dw.reshape((M * C, dw.size // (M * C))))


def _products_nt(Y, V, dU, beta):
    """dU[xi] = Y[xi] @ V[xi]^T + beta dU[xi] (the weight gradient's sum over a block's tiles)."""
    if Y.dtype == V.dtype and _cblas.nogil_available():
        _products_nt_blas(Y, V, dU, beta)
    else:
        for xi in range(V.shape[0]):
            _gemm.gemm(False, True, 1.0, Y[xi], V[xi], beta, dU[xi])


def _products(U, V, Mx, trans_u):
    """Mx[xi] = U[xi] @ V[xi], or U[xi]^T @ V[xi] with ``trans_u`` (U is (alpha^2, M, C))."""
    if U.dtype == V.dtype and _cblas.nogil_available():
        (_products_blas_t if trans_u else _products_blas)(U, V, Mx)
    else:
        for xi in range(V.shape[0]):
            _gemm.gemm(trans_u, False, 1.0, U[xi], V[xi], 0.0, Mx[xi])


class Workspace:
    """Grow-only buffers for a kernel call's temporaries (tile blocks, padded copies, tile
    origins), kept by a caller across calls (the Convolution layer keeps one per lane): after
    the first call of a shape no call allocates.  Without one, each call makes its own."""

    def __init__(self):
        self._bufs = {}

    def provide(self, name, flat):
        """Use the caller's flat array for buffer ``name`` (the layer's planned GEMM output)."""
        self._bufs[name] = flat

    def get(self, name, shape, dtype):
        n = math.prod(shape) if isinstance(shape, tuple) else shape  # (np.prod: ~4 us under the GIL)
        b = self._bufs.get(name)
        if b is None or b.size < n or b.dtype != dtype:
            b = self._bufs[name] = np.empty(n, dtype)
        return b[:n].reshape(shape)

    def origins(self, N, C, th, tw, m, Hq, Wq):
        """``_origins``' tile origins for this geometry, computed once and kept (the forward's
        input and output origins are the backward's x and dy origins)."""
        key = (N, C, th, tw, m, Hq, Wq)
        org = self._bufs.get(key)
        if org is None:
            org = self._bufs[key] = np.empty(N * th * tw, np.uint64)
            _origins(N, C, th, tw, m, Hq, Wq, org)
        return org


def _padded(x, Hq, Wq, ph, pw, ws=None, name="pad"):
    """x (N, C, H, W) placed at (ph, pw) in a zeroed (N, C, Hq, Wq) array, cut at its far edges
    (x itself when nothing moves)."""
    N, C, H, W = x.shape
    if (ph, pw, Hq, Wq) == (0, 0, H, W) and x.flags.c_contiguous:
        return x
    if ws is None:
        xq = np.zeros((N, C, Hq, Wq), x.dtype)
    else:
        xq = ws.get(name, (N, C, Hq, Wq), x.dtype)
        xq[...] = 0
    h, w = min(H, Hq - ph), min(W, Wq - pw)
    xq[:, :, ph : ph + h, pw : pw + w] = x[:, :, :h, :w]
    return xq


def block_products_size(x_shape, w_shape, ph, pw, m=4):
    """Values of the largest Mx block (alpha^2 x channels x tiles) ``fwd`` or ``bwd`` uses, the
    one big temporary (a caller may ``provide`` it to the Workspace as "Mx")."""
    N, C, H, W = x_shape
    M, _, r, _ = w_shape
    th, tw, _, _ = _geometry(N, H + 2 * ph - r + 1, W + 2 * pw - r + 1, m, r)
    return (m + r - 1) ** 2 * max(C, M) * min(N * th * tw, TILE_BLOCK)


def _blocks(ws, N, th, tw, C_in, C_out, a, dt):
    """Tile count, block size and each block's buffers (D, E, V, Mx, Z, O, sized for the widest
    of the forward's and the data gradient's uses)."""
    T = N * th * tw
    L = min(T, TILE_BLOCK)
    sizes = (a * a * L, a * a * L, a * a * C_in * L, a * a * C_out * L, a * a * L, a * a * L)
    return T, L, [ws.get(name, n, dt) for name, n in zip(("D", "E", "V", "Mx", "Z", "O"), sizes)]


def _geometry(N, OH, OW, m, r):
    th, tw = -(-OH // m), -(-OW // m)
    return th, tw, (th - 1) * m + m + r - 1, (tw - 1) * m + m + r - 1  # tiles, what they read


def filters(w, m, out=None):
    """U (alpha^2, M, C) = G w G^T for every (output, input) channel pair, by one GEMM in the
    filters' dtype from G kron G (into ``out`` if given)."""
    M, C, r, _ = w.shape
    kron = _sparse(m, r, np.dtype(w.dtype))["GG_" + np.dtype(w.dtype).name]
    U = np.empty(((m + r - 1) ** 2, M, C), w.dtype) if out is None else out.reshape((m + r - 1) ** 2, M, C)
    _gemm.gemm(False, True, 1.0, kron, np.ascontiguousarray(w).reshape(M * C, r * r), 0.0, U.reshape(-1, M * C))
    return U


@njit(nogil=True, cache=True)
def _same_bits(a, b):
    diff = a[0] ^ a[0]  # every pair's differing bits or-ed: no early exit, so the loop vectorizes
    for i in range(a.shape[0]):
        diff |= a[i] ^ b[i]
    return diff == 0


def same_bits(a, b):
    """Whether two arrays of one shape and dtype hold exactly the same bits (compared as
    unsigned integers: -0.0 is not 0.0, a NaN equals itself), without the GIL.  The Convolution
    layer's test that the weights did not change since it transformed them (``filters``):
    ~3 us for LeNet's conv2 (25,000 values) against ~70 us for the transform."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return _same_bits(np.ascontiguousarray(a).reshape(-1).view(bits), np.ascontiguousarray(b).reshape(-1).view(bits))


def _check(x, w, y, m, what):
    M, C, kh, kw = w.shape
    if not supported(kh, kw, 1, 1, 1, 1, m):
        raise ValueError(
            f"winograd.{what}: F({m}x{m}, {kh}x{kw}) is not supported (square kernels, alpha in {sorted(POINTS)})"
        )
    if x.dtype != w.dtype or y.dtype != w.dtype:
        raise ValueError(f"winograd.{what}: mixed dtypes {x.dtype}, {w.dtype}, {y.dtype}")


def fwd(x, w, bias, ph, pw, y, m=4, U=None, keep=None, ws=None):
    """y (N, M, OH, OW) = conv(x, w) + bias at stride 1, by F(m x m, r x r).  U: the filters
    already transformed (``filters(w, m)``), if the caller keeps them; keep: a buffer of
    ``tiles_size(x.shape, w.shape, ph, pw, m)`` values that receives every block's transformed
    input V, which ``bwd`` reads for the weight gradient (as im2col's columns are kept); ws: a
    ``Workspace`` for the temporaries."""
    _check(x, w, y, m, "fwd")
    N, C, H, W = x.shape
    M, _, r, _ = w.shape
    if x.shape[1] != w.shape[1] or y.shape != (N, M, H + 2 * ph - r + 1, W + 2 * pw - r + 1):
        raise ValueError(f"winograd.fwd: x {x.shape}, w {w.shape} and pad ({ph}, {pw}) do not give y {y.shape}")
    OH, OW = y.shape[2:]
    a = m + r - 1
    tr = _sparse(m, r, np.dtype(x.dtype))
    U = filters(w, m) if U is None else U
    th, tw, Hq, Wq = _geometry(N, OH, OW, m, r)
    ws = Workspace() if ws is None else ws
    xq = _padded(x, Hq, Wq, ph, pw, ws)
    exact = (OH, OW) == (th * m, tw * m) and y.flags.c_contiguous
    yq = y if exact else ws.get("out", (N, M, th * m, tw * m), y.dtype)
    T, L, (D, E, V, Mx, Z, O) = _blocks(ws, N, th, tw, C, M, a, x.dtype)
    org_in, org_out = ws.origins(N, C, th, tw, m, Hq, Wq), ws.origins(N, M, th, tw, m, th * m, tw * m)
    xf, yf = xq.reshape(-1), yq.reshape(-1)
    if COMPILED_PASSES and U.dtype == x.dtype and (keep is None or keep.dtype == x.dtype) and _cblas.nogil_available():
        # the loop below, compiled whole (one release of the GIL for the pass)
        kept = V[:0] if keep is None else keep
        _fwd_blas(a, xf, C, Hq, Wq, org_in, U, V, kept, M, bias, yf, th * m, tw * m, org_out, L, tr["BT"], tr["AT"], D, E, Mx, Z, O)  # fmt: skip
    else:
        for t0 in range(0, T, L):
            n = min(L, T - t0)
            Vb = V[: a * a * C * n] if keep is None else keep[a * a * C * t0 : a * a * C * (t0 + n)]
            Mb = Mx[: a * a * M * n]
            _tiles_in(xf, C, Hq, Wq, org_in, t0, n, a, *tr["BT"], D, E, Vb)
            _products(U, Vb.reshape(a * a, C, n), Mb.reshape(a * a, M, n), False)
            _tiles_out(Mb, M, a, bias, False, yf, th * m, tw * m, org_out, t0, n, *tr["AT"], Z, O)
    if not exact:
        y[...] = yq[:, :, :OH, :OW]


def tiles_size(x_shape, w_shape, ph, pw, m=4):
    """Values of the transformed input V (alpha^2 x C x tiles) that ``fwd`` keeps."""
    N, C, H, W = x_shape
    r = w_shape[2]
    th, tw, _, _ = _geometry(N, H + 2 * ph - r + 1, W + 2 * pw - r + 1, m, r)
    return (m + r - 1) ** 2 * C * N * th * tw


def bwd(x_shape, dy, w, ph, pw, dx=None, dw=None, m=4, U=None, kept=None, x=None, beta=0.0, ws=None):
    """The two gradients of the stride-1 convolution ``fwd`` computes, its steps transposed and
    run backwards, from one transform of dy.  Each m x m tile of dy is transformed by A on both
    axes (Y = A dy A^T, alpha x alpha); then
      dx (N, C, H, W), if given, OVERWRITTEN: per xi, U[xi]^T @ Y[xi] over the output
         channels, transformed by B (B . B^T) and added into the alpha x alpha input tile it came
         from (neighbouring tiles overlap by r - 1);
      dw (M, C, r, r), if given (OVERWRITTEN, or with ``beta`` 1 accumulated into): per xi, dU[xi] = Y[xi] @ V[xi]^T summed over the
         tiles (V: the forward's transformed input, ``kept`` by fwd, else transformed from x
         here), then dw = G^T dU G (one GEMM with G kron G transposed)."""
    N, C, H, W = x_shape
    M, _, r, _ = w.shape
    _check(dy, w, dy, m, "bwd")
    OH, OW = H + 2 * ph - r + 1, W + 2 * pw - r + 1
    if w.shape[1] != C or dy.shape != (N, M, OH, OW):
        raise ValueError(f"winograd.bwd: dy {dy.shape}, w {w.shape} and pad ({ph}, {pw}) do not fit x {tuple(x_shape)}")
    a = m + r - 1
    dt = dy.dtype
    tr = _sparse(m, r, np.dtype(dt))
    th, tw, Hq, Wq = _geometry(N, OH, OW, m, r)
    ws = Workspace() if ws is None else ws
    T, L, (D, E, Y, Mx, Z, O) = _blocks(ws, N, th, tw, M, max(C, M), a, dt)
    org_dy, org_x = ws.origins(N, M, th, tw, m, th * m, tw * m), ws.origins(N, C, th, tw, m, Hq, Wq)
    yf = _padded(dy, th * m, tw * m, 0, 0, ws, "pad_dy").reshape(-1)
    if dx is not None:
        U = filters(w, m) if U is None else U
        exact = (ph, pw, Hq, Wq) == (0, 0, H, W) and dx.flags.c_contiguous
        dxq = dx if exact else ws.get("out", (N, C, Hq, Wq), dt)
        dxq[...] = 0
        xf = dxq.reshape(-1)
    if dw is not None:
        dU = ws.get("dU", (a * a, M, C), dt)
        if kept is None:
            xin = _padded(x, Hq, Wq, ph, pw, ws).reshape(-1)
            V = ws.get("V_x", a * a * C * L, dt)
    GG = tr["GG_" + np.dtype(dt).name]
    blas = _cblas.nogil_available() and (dx is None or U.dtype == dt) and (kept is None or kept.dtype == dt)
    if COMPILED_PASSES and blas and (dw is None or dw.flags.c_contiguous):
        # the loop below and the last GEMM, compiled whole (one release of the GIL for the pass)
        none, none3 = Y[:0], ws.get("none3", (0, 0, 0), dt)
        _bwd_blas(
            a, m, yf, M, th * m, tw * m, org_dy, C, Hq, Wq, org_x, none3 if dx is None else U,
            none if dx is None else xf, none if dw is None or kept is not None else xin,
            none if kept is None else kept, none if dw is None or kept is not None else V,
            none3 if dw is None else dU, none if dw is None else dw.reshape(-1), float(beta), GG, L,
            (tr["A"], tr["B"], tr["BT"]), D, E, Y, Mx, Z, O,
        )  # fmt: skip
        if dx is not None and not exact:
            dx[...] = dxq[:, :, ph : ph + H, pw : pw + W]
        return
    for t0 in range(0, T, L):
        n = min(L, T - t0)
        Yb = Y[: a * a * M * n]
        _tiles_in(yf, M, th * m, tw * m, org_dy, t0, n, m, *tr["A"], D, E, Yb)
        Y3 = Yb.reshape(a * a, M, n)
        if dx is not None:
            Mb = Mx[: a * a * C * n]
            _products(U, Y3, Mb.reshape(a * a, C, n), True)
            no_bias = dy[:0, 0, 0, 0]
            _tiles_out(Mb, C, a, no_bias, True, xf, Hq, Wq, org_x, t0, n, *tr["B"], Z, O)
        if dw is not None:
            if kept is None:
                Vb = V[: a * a * C * n]
                _tiles_in(xin, C, Hq, Wq, org_x, t0, n, a, *tr["BT"], D, E, Vb)
            else:
                Vb = kept[a * a * C * t0 : a * a * C * (t0 + n)]
            _products_nt(Y3, Vb.reshape(a * a, C, n), dU, 0.0 if t0 == 0 else 1.0)
    if dx is not None and not exact:
        dx[...] = dxq[:, :, ph : ph + H, pw : pw + W]
    if dw is not None:  # dw (r^2, M*C) = (G kron G)^T @ dU (alpha^2, M*C), written transposed
        _gemm.gemm(True, False, 1.0, dU.reshape(a * a, M * C), GG, beta, dw.reshape(M * C, r * r))


def bwd_data(dy, w, ph, pw, dx, m=4, U=None):
    """dx (N, C, H, W) = the input gradient (``bwd`` with dx only)."""
    _check(dy, w, dx, m, "bwd_data")
    bwd(dx.shape, dy, w, ph, pw, dx=dx, m=m, U=U)


def bwd_filter(x, dy, ph, pw, dw, m=4):
    """dw (M, C, r, r) = the weight gradient (``bwd`` with dw only, V transformed from x here)."""
    _check(x, dw, dy, m, "bwd_filter")
    bwd(x.shape, dy, dw, ph, pw, dw=dw, m=m, x=x)
