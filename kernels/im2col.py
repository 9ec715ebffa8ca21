"""im2col / col2im: unroll convolution patches into the columns of a matrix, and back.

Contract (docs/ARCHITECTURE.md, "Kernels"):

    im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)   x (N, C, H, W) -> col (C*kh*kw, N*OH*OW)
    col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x)   col -> x, x OVERWRITTEN with the patch sums

    row    r = (c*kh + i)*kw + j            (channel, kernel row, kernel column)
    column q = n*OH*OW + oh*OW + ow         (image, output row, output column)
    col[r, q] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw], 0 outside the image
    OH = (H + 2*ph - (dh*(kh-1) + 1)) // sh + 1   (Caffe's floor rounding; OW likewise)

The batch lives in the columns, so a convolution layer does ONE GEMM per batch,
W (OC, C*kh*kw) @ col -> (OC, N*OH*OW), instead of Caffe's one GEMM per image; the layer moves
N to the front afterwards.  Arrays are C-contiguous float32 or float64; col must have exactly
the shape above (checked: a wrong shape raises ValueError instead of writing out of bounds).

Versions:
  v1_naive   one loop per element of col, in col's order, with a bounds test on every element
             (the textbook loop; Caffe's im2col_cpu with the batch folded in).
  v2_rows    the same order, but for each (row, output row) the range of ow that lands inside
             the image is computed once: the inner loop is a branch-free slice copy
             (contiguous when sw == 1), and the padding is written as zeros separately.
  v3_flat    v2's loops on flat views of x and col with unsigned offsets: no array view is
             made inside the loops (each costs two atomic reference-count updates) and no
             negative-index fix-up is compiled into each access.  2-4x faster than v2 when
             output rows are short (LeNet's conv2: 8 values).  A tap wholly inside the image
             at unit column stride (every tap of an unpadded convolution) is a bare loop of
             row copies: 1.5-1.8x on LeNet's conv2.  Serial, nogil: the engine's default.
  v4_prange  v3 with numba's prange (im2col: rows of col split across cores; col2im: channels,
             which write disjoint parts of x).  Opt-in: numba's default workqueue threading
             layer cannot run two parallel regions at once, so it must not be called from
             several Python threads; the serial versions can (they release the GIL).
"""

import numpy as np
from numba import njit, prange

from . import _versions

__all__ = ["im2col", "col2im", "im2col_reference", "col2im_reference", "out_size", "VERSIONS", "DEFAULTS", "use"]


@njit(nogil=True, cache=True)
def out_size(size, k, p, s, d):
    """Caffe's output size of a convolution along one axis (floor rounding)."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


@njit(nogil=True, cache=True)
def _ceil_div(a, b):
    return -((-a) // b)


@njit(nogil=True, cache=True)
def _valid_range(off, s, size, out):
    """[lo, hi): the o in [0, out) with 0 <= o*s + off < size."""
    lo = min(max(_ceil_div(-off, s), 0), out)
    hi = min(max(_ceil_div(size - off, s), lo), out)
    return lo, hi


@njit(nogil=True, cache=True)
def _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W = x.shape
    if kh < 1 or kw < 1 or sh < 1 or sw < 1 or dh < 1 or dw < 1 or ph < 0 or pw < 0:
        raise ValueError("im2col/col2im: kernel, stride, dilation must be >= 1, pad >= 0")
    OH = out_size(H, kh, ph, sh, dh)
    OW = out_size(W, kw, pw, sw, dw)
    if OH < 1 or OW < 1:
        raise ValueError("im2col/col2im: the (dilated) kernel is larger than the padded input")
    if col.shape[0] != C * kh * kw or col.shape[1] != N * OH * OW:
        raise ValueError("im2col/col2im: col must have shape (C*kh*kw, N*OH*OW)")
    return N, C, H, W, OH, OW


# -- reference (numpy, float64) ----------------------------------------------------------------
def im2col_reference(x, kh, kw, ph, pw, sh, sw, dh, dw, col=None):
    """float64 col from slices of the zero-padded input (one strided slice per (i, j))."""
    x = np.asarray(x, dtype=np.float64)
    N, C, H, W = x.shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.empty((C, kh, kw, N, OH, OW))
    for i in range(kh):
        for j in range(kw):
            patch = xp[
                :, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw
            ]  # (N, C, OH, OW)
            out[:, i, j] = patch.transpose(1, 0, 2, 3)
    out = out.reshape(C * kh * kw, N * OH * OW)
    if col is not None:
        col[...] = out
    return out


def col2im_reference(col, kh, kw, ph, pw, sh, sw, dh, dw, x_shape, x=None):
    """float64 x of shape x_shape: every column added back at its patch (the adjoint of im2col)."""
    N, C, H, W = x_shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    c6 = np.asarray(col, dtype=np.float64).reshape(C, kh, kw, N, OH, OW)
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            xp[:, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw] += c6[
                :, i, j
            ].transpose(1, 0, 2, 3)
    out = xp[:, :, ph : ph + H, pw : pw + W]
    if x is not None:
        x[...] = out
    return out


# -- v1: naive ----------------------------------------------------------------------------------
def col_pixel(r, q, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW):
    """The input pixel (n, c, ih, iw) that col element (r, q) copies (may lie in the padding).

    Row r = (c*kh + i)*kw + j names the channel and kernel tap; column q = n*OH*OW + oh*OW + ow
    names the image and output position.  One source, compiled twice (STYLE 3): with njit here
    and with cuda.jit(device=True) by kernels/cuda/im2col.py's one-thread-per-element version.
    """
    c = r // (kh * kw)
    i = (r // kw) % kh
    j = r % kw
    n = q // (OH * OW)
    oh = (q // OW) % OH
    ow = q % OW
    return n, c, oh * sh - ph + i * dh, ow * sw - pw + j * dw


_col_pixel = njit(nogil=True, cache=True, inline="always")(col_pixel)


@njit(nogil=True, cache=True)
def im2col_v1_naive(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    for r in range(C * kh * kw):
        for q in range(N * OH * OW):
            n, c, ih, iw = _col_pixel(r, q, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
            if 0 <= ih < H and 0 <= iw < W:
                col[r, q] = x[n, c, ih, iw]
            else:
                col[r, q] = 0


@njit(nogil=True, cache=True)
def col2im_v1_naive(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    x[...] = 0
    for r in range(C * kh * kw):
        for q in range(N * OH * OW):
            n, c, ih, iw = _col_pixel(r, q, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
            if 0 <= ih < H and 0 <= iw < W:
                x[n, c, ih, iw] += col[r, q]


# -- v2: rows, bounds hoisted -------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW):
    """For each kernel row i the output rows [oh_lo, oh_hi) whose input row is inside the
    image; for each kernel column j the same for output columns (computed once per call:
    integer divisions are expensive, and they do not depend on n, c or oh)."""
    oh_rng = np.empty((kh, 2), np.int64)
    ow_rng = np.empty((kw, 2), np.int64)
    for i in range(kh):
        oh_rng[i, 0], oh_rng[i, 1] = _valid_range(i * dh - ph, sh, H, OH)
    for j in range(kw):
        ow_rng[j, 0], ow_rng[j, 1] = _valid_range(j * dw - pw, sw, W, OW)
    return oh_rng, ow_rng


@njit(nogil=True, cache=True, inline="always")
def _im2col_tap(xp, i, j, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, crow):
    """crow (OH*OW,) = the input plane xp (H, W) seen through kernel tap (i, j): rows of the
    padding are zeros, the inside is one slice copy per output row (contiguous if sw == 1)."""
    oh_lo, oh_hi = oh_rng[i, 0], oh_rng[i, 1]
    ow_lo, ow_hi = ow_rng[j, 0], ow_rng[j, 1]
    off_w = j * dw - pw
    crow[: oh_lo * OW] = 0
    for oh in range(oh_lo, oh_hi):
        ih = oh * sh - ph + i * dh
        d = oh * OW
        crow[d : d + ow_lo] = 0
        if ow_hi > ow_lo:  # (an empty range would make the source slice negative)
            crow[d + ow_lo : d + ow_hi] = xp[ih, ow_lo * sw + off_w : (ow_hi - 1) * sw + off_w + 1 : sw]
        crow[d + ow_hi : d + OW] = 0
    crow[oh_hi * OW :] = 0


@njit(nogil=True, cache=True, inline="always")
def _col2im_tap(crow, i, j, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, xp):
    """xp (H, W) += crow (OH*OW,) put back through kernel tap (i, j): the adjoint of
    _im2col_tap (padding positions are dropped)."""
    oh_lo, oh_hi = oh_rng[i, 0], oh_rng[i, 1]
    ow_lo, ow_hi = ow_rng[j, 0], ow_rng[j, 1]
    off_w = j * dw - pw
    for oh in range(oh_lo, oh_hi):
        ih = oh * sh - ph + i * dh
        d = oh * OW
        if sw == 1:
            for ow in range(ow_lo, ow_hi):
                xp[ih, ow + off_w] += crow[d + ow]
        else:
            for ow in range(ow_lo, ow_hi):
                xp[ih, ow * sw + off_w] += crow[d + ow]


@njit(nogil=True, cache=True)
def im2col_v2_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    P = OH * OW
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                row = col[(c * kh + i) * kw + j]
                for n in range(N):
                    _im2col_tap(x[n, c], i, j, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, row[n * P : (n + 1) * P])


@njit(nogil=True, cache=True)
def col2im_v2_rows(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    P = OH * OW
    x[...] = 0
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                row = col[(c * kh + i) * kw + j]
                for n in range(N):
                    _col2im_tap(row[n * P : (n + 1) * P], i, j, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, x[n, c])


# -- v3: flat, unsigned indices ------------------------------------------------------------------
# Two numba costs dominate v2 when output rows are short (LeNet's conv2: OW = 8):
#  * every slice is a new array view, and a view increments and decrements a reference count
#    with atomic instructions: two views per output row cost more than copying its 8 values;
#  * an int64 index may be negative, so numba adds "if i < 0: i += n" to every access, which
#    also keeps LLVM from proving a loop contiguous.  An unsigned index cannot be negative.
# v3 indexes flat (1-d, C-order) views of x and col, made once per call, with uint64 offsets.
_U = np.uint64


@njit(nogil=True, cache=True, inline="always")
def _im2col_tap_flat(xf, s0, cf, d0, sh, sw, W, OW, P, oh_lo, oh_hi, ow_lo, ow_hi, z):
    """cf[d0:d0+P] = one kernel tap of one input plane; s0 = the (signed) flat offset of
    input element (oh=0, ow=0) of this tap, valid only inside [oh_lo, oh_hi) x [ow_lo, ow_hi).

    A tap that lies wholly inside the image at unit stride (every tap of an unpadded
    convolution: LeNet's conv2) takes a loop of row copies and nothing else: 1.8x faster there
    than the general loop below, whose empty zero-fill loops and re-derived offsets cost more
    than copying an 8-value row."""
    if sw == 1 and ow_lo == 0 and ow_hi == OW and oh_lo == 0 and oh_hi * OW == P:
        src, dst, ow_u, step = _U(s0), _U(d0), _U(OW), _U(sh * W)  # s0 >= 0: (0, 0) is inside
        for _ in range(_U(oh_hi)):
            for k in range(ow_u):
                cf[dst + k] = xf[src + k]
            src += step
            dst += ow_u
        return
    for q in range(_U(d0), _U(d0 + oh_lo * OW)):
        cf[q] = z
    n_in = _U(ow_hi - ow_lo)
    for oh in range(oh_lo, oh_hi):
        d = _U(d0 + oh * OW)
        for q in range(d, d + _U(ow_lo)):
            cf[q] = z
        dd = d + _U(ow_lo)
        src = _U(s0 + oh * sh * W + ow_lo * sw)
        if sw == 1:
            for k in range(_U(0), n_in):
                cf[dd + k] = xf[src + k]
        else:
            st = _U(sw)
            for k in range(_U(0), n_in):
                cf[dd + k] = xf[src + k * st]
        for q in range(dd + n_in, d + _U(OW)):
            cf[q] = z
    for q in range(_U(d0 + oh_hi * OW), _U(d0 + P)):
        cf[q] = z


@njit(nogil=True, cache=True, inline="always")
def _col2im_tap_flat(cf, d0, xf, s0, sh, sw, W, OW, oh_lo, oh_hi, ow_lo, ow_hi):
    """The adjoint: xf[...] += cf[d0:d0+P] through one kernel tap (padding dropped); a tap
    wholly inside the image at unit stride is a loop of row additions, as in im2col."""
    if sw == 1 and ow_lo == 0 and ow_hi == OW and oh_lo == 0:
        src, dst, ow_u, step = _U(d0), _U(s0), _U(OW), _U(sh * W)
        for _ in range(_U(oh_hi)):
            for k in range(ow_u):
                xf[dst + k] += cf[src + k]
            src += ow_u
            dst += step
        return
    n_in = _U(ow_hi - ow_lo)
    for oh in range(oh_lo, oh_hi):
        dd = _U(d0 + oh * OW + ow_lo)
        dst = _U(s0 + oh * sh * W + ow_lo * sw)
        if sw == 1:
            for k in range(_U(0), n_in):
                xf[dst + k] += cf[dd + k]
        else:
            st = _U(sw)
            for k in range(_U(0), n_in):
                xf[dst + k * st] += cf[dd + k]


@njit(nogil=True, cache=True, inline="always")
def _im2col_row_flat(x, r, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, col):
    """Row r of col: tap (i, j) of channel c for every image."""
    N, C, H, W = x.shape
    xf = x.reshape(x.size)
    cf = col.reshape(col.size)
    c = r // (kh * kw)
    i = (r // kw) % kh
    j = r % kw
    P = OH * OW
    z = col.dtype.type(0)
    for n in range(N):
        s0 = (n * C + c) * H * W + (i * dh - ph) * W + (j * dw - pw)
        _im2col_tap_flat(
            xf, s0, cf, (r * N + n) * P, sh, sw, W, OW, P, oh_rng[i, 0], oh_rng[i, 1], ow_rng[j, 0], ow_rng[j, 1], z
        )


@njit(nogil=True, cache=True, inline="always")
def _col2im_channel_flat(col, c, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, x):
    """x[:, c] = the sum of its kh*kw rows of col (x[:, c] is zeroed first)."""
    N, C, H, W = x.shape
    xf = x.reshape(x.size)
    cf = col.reshape(col.size)
    P = OH * OW
    for n in range(N):
        base = (n * C + c) * H * W
        for q in range(_U(base), _U(base + H * W)):
            xf[q] = 0
        for i in range(kh):
            for j in range(kw):
                r = (c * kh + i) * kw + j
                s0 = base + (i * dh - ph) * W + (j * dw - pw)
                _col2im_tap_flat(
                    cf, (r * N + n) * P, xf, s0, sh, sw, W, OW, oh_rng[i, 0], oh_rng[i, 1], ow_rng[j, 0], ow_rng[j, 1]
                )


@njit(nogil=True, cache=True)
def im2col_v3_flat(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for r in range(C * kh * kw):
        _im2col_row_flat(x, r, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, col)


@njit(nogil=True, cache=True)
def col2im_v3_flat(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for c in range(C):
        _col2im_channel_flat(col, c, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, x)


# -- v4: prange -----------------------------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True)
def im2col_v4_prange(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for r in prange(C * kh * kw):
        _im2col_row_flat(x, r, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, col)


@njit(nogil=True, cache=True, parallel=True)
def col2im_v4_prange(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _check(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    oh_rng, ow_rng = _ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for c in prange(C):  # channel c writes only x[:, c]: no two threads collide
        _col2im_channel_flat(col, c, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, oh_rng, ow_rng, x)


# -- the transposed layout: one row per output pixel ------------------------------------------------
# rows = col^T: rows[q, r] = col[r, q], an (N*OH*OW, C*kh*kw) C-contiguous matrix, each output
# pixel's whole patch in one row.  Why a convolution layer wants it: on the host, OpenBLAS runs the
# products of LeNet's conv2 1.2-1.4x faster with the pixels as the rows of the large operand and
# of the result (rows @ W^T; dRows = dY^T @ W) than with col's layout (W @ col; dCol = W^T @ dY):
# docs/KERNELS.md.  Every version of im2col and col2im takes this layout when it is handed ``col``
# as ``rows.T`` (the same (C*kh*kw, N*OH*OW) shape, F-ordered), so the backend's contract is
# unchanged; ``im2row`` and ``row2im`` below do the work.
#
# Row q is filled patch by patch: for each channel, kh runs of kw values copied from the input.
# A run of a few values copies fast only when its length is known at compile time (LLVM then
# unrolls it into a handful of moves; with kw a runtime argument each run is a short loop with
# its trip-count checks, 1.8x slower on conv2): so each kernel width gets its own compiled pair,
# made by ``_row_kernels(kw)`` and cached on disk like every kernel (numba keys a closure's cache
# entry by the values it closes over).


@njit(nogil=True, cache=True)
def _patch_checked(xf, rf, d, n, C, H, W, h0, w0, kh, kw, dh, dw, z):
    """rf[d:d + C*kh*kw] = the patch of image n at (h0, w0), zero where it reaches into the padding."""
    for c in range(C):
        for i in range(kh):
            ih = h0 + i * dh
            for j in range(kw):
                iw = w0 + j * dw
                rf[d] = xf[((n * C + c) * H + ih) * W + iw] if 0 <= ih < H and 0 <= iw < W else z
                d += _U(1)


@njit(nogil=True, cache=True)
def _patch_checked_add(rf, d, xf, n, C, H, W, h0, w0, kh, kw, dh, dw):
    """The adjoint: the patch's values inside the image added from rf[d:d + C*kh*kw]."""
    for c in range(C):
        for i in range(kh):
            ih = h0 + i * dh
            for j in range(kw):
                iw = w0 + j * dw
                if 0 <= ih < H and 0 <= iw < W:
                    xf[((n * C + c) * H + ih) * W + iw] += rf[d]
                d += _U(1)


@njit(nogil=True, cache=True)
def _row_geometry(H, W, kh, kw, ph, pw, sh, sw, dh, dw):
    """(OH, OW, oh_lo, oh_hi, ow_lo, ow_hi): the output size and the output pixels whose whole patch
    lies inside the image with unit column dilation (each of its kh runs is kw adjacent values),
    which im2row/row2im copy with no bounds test per value; the others take the checked loop."""
    OH, OW = out_size(H, kh, ph, sh, dh), out_size(W, kw, pw, sw, dw)
    oh_lo, oh_hi = _valid_range(-ph, sh, H - dh * (kh - 1), OH)
    ow_lo, ow_hi = _valid_range(-pw, sw, W - dw * (kw - 1), OW)
    if dw != 1:
        ow_hi = ow_lo  # every patch takes the checked loop
    return OH, OW, oh_lo, oh_hi, ow_lo, ow_hi


def _make_row_kernels(KW):
    """im2row and row2im compiled for kernel width KW (a constant inside them)."""

    @njit(nogil=True, cache=True)
    def im2row_kw(x, kh, ph, pw, sh, sw, dh, dw, rows):
        """rows[q, r] = col[r, q]: pixel by pixel, in rows' order (each row written once, in order)."""
        N, C, H, W = x.shape
        OH, OW, oh_lo, oh_hi, ow_lo, ow_hi = _row_geometry(H, W, kh, KW, ph, pw, sh, sw, dh, dw)
        xf, rf = x.reshape(x.size), rows.reshape(rows.size)
        z = rows.dtype.type(0)
        d = _U(0)
        for n in range(N):
            for oh in range(OH):
                h0 = oh * sh - ph
                for ow in range(OW):
                    w0 = ow * sw - pw
                    if oh_lo <= oh < oh_hi and ow_lo <= ow < ow_hi:
                        for c in range(C):
                            s = _U(((n * C + c) * H + h0) * W + w0)
                            for _ in range(kh):
                                for j in range(KW):  # KW is a constant: unrolled
                                    rf[d + _U(j)] = xf[s + _U(j)]
                                d += _U(KW)
                                s += _U(dh * W)
                    else:  # a patch that reaches into the padding (or is dilated along w)
                        _patch_checked(xf, rf, d, n, C, H, W, h0, w0, kh, KW, dh, dw, z)
                        d += _U(C * kh * KW)

    @njit(nogil=True, cache=True)
    def row2im_kw(rows, kh, ph, pw, sh, sw, dh, dw, x):
        """The adjoint: x = 0, then each row of rows added back onto its patch (padding dropped)."""
        N, C, H, W = x.shape
        OH, OW, oh_lo, oh_hi, ow_lo, ow_hi = _row_geometry(H, W, kh, KW, ph, pw, sh, sw, dh, dw)
        xf, rf = x.reshape(x.size), rows.reshape(rows.size)
        xf[:] = 0
        d = _U(0)
        for n in range(N):
            for oh in range(OH):
                h0 = oh * sh - ph
                for ow in range(OW):
                    w0 = ow * sw - pw
                    if oh_lo <= oh < oh_hi and ow_lo <= ow < ow_hi:
                        for c in range(C):
                            s = _U(((n * C + c) * H + h0) * W + w0)
                            for _ in range(kh):
                                for j in range(KW):
                                    xf[s + _U(j)] += rf[d + _U(j)]
                                d += _U(KW)
                                s += _U(dh * W)
                    else:
                        _patch_checked_add(rf, d, xf, n, C, H, W, h0, w0, kh, KW, dh, dw)
                        d += _U(C * kh * KW)

    return im2row_kw, row2im_kw


_ROW_KERNELS = {}


def _row_kernels(kw):
    """(im2row, row2im) for kernel width kw, made at first use."""
    pair = _ROW_KERNELS.get(kw)
    if pair is None:
        pair = _ROW_KERNELS[kw] = _make_row_kernels(int(kw))
    return pair


def _check_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, rows):
    N, C, H, W = x.shape
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("im2row/row2im: kernel, stride, dilation must be >= 1, pad >= 0")
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    if OH < 1 or OW < 1:
        raise ValueError("im2row/row2im: the (dilated) kernel is larger than the padded input")
    if rows.shape != (N * OH * OW, C * kh * kw) or not rows.flags.c_contiguous or rows.dtype != x.dtype:
        raise ValueError(
            f"im2row/row2im: rows must be a C-contiguous ({N * OH * OW}, {C * kh * kw}) array of x's dtype, "
            f"got {rows.shape} {rows.dtype}"
        )


def im2row(x, kh, kw, ph, pw, sh, sw, dh, dw, rows):
    """rows (N*OH*OW, C*kh*kw) = im2col(x)^T: one row per output pixel, its patch in col's order."""
    _check_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, rows)
    _row_kernels(kw)[0](x, kh, ph, pw, sh, sw, dh, dw, rows)


def row2im(rows, kh, kw, ph, pw, sh, sw, dh, dw, x):
    """x (N, C, H, W) OVERWRITTEN with col2im(rows^T): each pixel's row summed back onto its patch."""
    _check_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, rows)
    _row_kernels(kw)[1](rows, kh, ph, pw, sh, sw, dh, dw, x)


def _transposed(col):
    """True when col is the transpose of a C-contiguous matrix (and not itself C-contiguous)."""
    return not col.flags.c_contiguous and col.T.flags.c_contiguous


def _im2col_layouts(kernel):
    """im2col version ``kernel``, taking col either as itself or as ``rows.T`` (then im2row)."""

    def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
        if _transposed(col):
            im2row(x, kh, kw, ph, pw, sh, sw, dh, dw, col.T)
        else:
            kernel(x, kh, kw, ph, pw, sh, sw, dh, dw, col)

    im2col.kernel = kernel
    im2col.__doc__ = kernel.__doc__
    return im2col


def _col2im_layouts(kernel):
    """col2im version ``kernel``, taking col either as itself or as ``rows.T`` (then row2im)."""

    def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x):
        if _transposed(col):
            row2im(col.T, kh, kw, ph, pw, sh, sw, dh, dw, x)
        else:
            kernel(col, kh, kw, ph, pw, sh, sw, dh, dw, x)

    col2im.kernel = kernel
    col2im.__doc__ = kernel.__doc__
    return col2im


VERSIONS = {
    "im2col": {
        "v1_naive": _im2col_layouts(im2col_v1_naive),
        "v2_rows": _im2col_layouts(im2col_v2_rows),
        "v3_flat": _im2col_layouts(im2col_v3_flat),
        "v4_prange": _im2col_layouts(im2col_v4_prange),
    },
    "col2im": {
        "v1_naive": _col2im_layouts(col2im_v1_naive),
        "v2_rows": _col2im_layouts(col2im_v2_rows),
        "v3_flat": _col2im_layouts(col2im_v3_flat),
        "v4_prange": _col2im_layouts(col2im_v4_prange),
    },
}
DEFAULTS = {"im2col": "v3_flat", "col2im": "v3_flat"}
REFERENCES = {"im2col": im2col_reference, "col2im": col2im_reference}

im2col = VERSIONS["im2col"][DEFAULTS["im2col"]]
col2im = VERSIONS["col2im"][DEFAULTS["col2im"]]


def use(version):
    """Bind im2col and col2im to ``version`` (a key of VERSIONS[...], or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("im2col")


# -- self-check and benchmark: python -m kernels.im2col --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.im2col``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import im2col as IM

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(2)
    shapes = [
        ("LeNet conv1", (64, 1, 28, 28), 5, 0),
        ("LeNet conv2", (64, 20, 12, 12), 5, 0),
        ("CIFAR conv1", (100, 3, 32, 32), 5, 2),
        ("CIFAR conv2", (100, 32, 16, 16), 5, 2),
    ]
    if quick:
        shapes = shapes[:2] + shapes[3:]
    cases = []
    for name, xs, k, p in shapes:
        x = rng.standard_normal(xs).astype(F32)
        ref = IM.im2col_reference(x, k, k, p, p, 1, 1, 1, 1)
        col = np.empty(ref.shape, F32)
        back = np.empty(xs, F32)
        ref_back = IM.col2im_reference(ref, k, k, p, p, 1, 1, 1, 1, xs)
        mag_back = IM.col2im_reference(np.abs(ref), k, k, p, p, 1, 1, 1, 1, xs)
        nbytes = 4.0 * (x.size + col.size)

        def run_f(fn, x=x, col=col, k=k, p=p):
            return lambda: fn(x, k, k, p, p, 1, 1, 1, 1, col)

        def run_b(fn, col=col, back=back, k=k, p=p, ref=ref):
            col[...] = ref
            return lambda: fn(col, k, k, p, p, 1, 1, 1, 1, back)

        def check_f(fn, col=col, ref=ref):
            close(col, ref, 0.0, "im2col")

        def check_b(fn, back=back, ref_back=ref_back, mag=mag_back, k=k):
            close(back, ref_back, sum_tol(k * k, mag), "col2im")

        def base_f(x=x, k=k, p=p, col=col):
            # numpy: pad, a strided window view, one copy into col's layout
            N, C, H, W = x.shape
            xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
            v = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
            col.reshape(C, k, k, N, -1)[...] = v.transpose(1, 4, 5, 0, 2, 3).reshape(C, k, k, N, -1)

        cases.append(
            Case("im2col", "im2col", f"{name} x{xs} k{k} p{p}", "memory", 0, nbytes, run_f, check_f, baseline=base_f)
        )
        cases.append(Case("im2col", "col2im", f"{name} x{xs} k{k} p{p}", "memory", 0, nbytes, run_b, check_b))
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("im2col"))
