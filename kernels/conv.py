"""Convolution forward as a whole: direct loops against im2col + GEMM.

Contract (a lab kernel: the engine's ConvolutionLayer composes im2col and gemm itself; this
family measures that composition against direct convolution, so a student sees where the
time goes):

    conv_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y)
        x (N, C, H, W), w (M, C, kh, kw), bias (M,) or (0,) for none, y (N, M, OH, OW)
        y[n, m, oh, ow] = bias[m] + sum_{c,i,j} w[m,c,i,j] * x[n, c, oh*sh-ph+i*dh, ow*sw-pw+j*dw]
        (zero outside the image; OH, OW with Caffe's floor rounding; no groups)
    conv_bwd_data(dy, w, ph, pw, sh, sw, dh, dw, dx)
        dy (N, M, OH, OW), w (M, C, kh, kw), dx (N, C, H, W) OVERWRITTEN: the gradient to the
        input, dx = col2im(W^T @ dY) -- each dy value spread back over the inputs it read
    conv_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt)
        dwt (M, C, kh, kw) OVERWRITTEN: the gradient to the weights, dW = dY @ col^T (Caffe's
        layer accumulates it into the weight diff; this kernel overwrites)

Versions (conv_bwd_data and conv_bwd_filter have v1_naive, v3_im2col_blas and v4_implicit,
the same ideas run backwards: bwd_data's v3 is BLAS's W^T @ dY into a dcol workspace, then
col2im, and its v4 computes dcol KB rows at a time into an L2-sized buffer and col2im's them
into dx at once, so dcol is never written; bwd_filter's v3 is im2col then BLAS's dY @ col^T,
and its v4 regenerates col a block at a time, as the forward does, and feeds it to v3_micro's
dot-product kernel):
  v1_naive        the definition: seven nested loops, a bounds test per multiply-add.
  v2_direct       loops turned so the innermost runs along an output row: y[n,m,oh,:] +=
                  w[m,c,i,j] * x[n,c,ih, (ow*sw + j*dw - pw)] over the valid ow range, hoisted
                  bounds, unit stride when sw == 1 (an AXPY LLVM vectorizes).  No workspace.
  v3_im2col_blas  im2col (the default numba kernel) into a (C*kh*kw, N*OH*OW) workspace, one
                  BLAS GEMM W (M, C*kh*kw) @ col, then (M, N, OH*OW) -> (N, M, OH*OW) and the
                  bias.  What the engine's ConvolutionLayer does; the default.
  v4_implicit     implicit GEMM: col is never materialized.  The columns are taken a block
                  of whole images at a time (~1024 columns), and for each KB = 256 rows of col
                  the block's slice is unrolled straight into a small buffer (im2col's v3 row
                  filler: the "packing" of the GEMM's B operand is im2col itself) that stays in
                  L2 while the AXPY micro-kernel of kernels.gemm v3_micro multiplies it in; the
                  epilogue writes y in NCHW with the bias from the block's result.  The memory
                  traffic of the (C*kh*kw x N*OH*OW) workspace -- 25x the input for a 5x5 kernel
                  -- disappears, and the layout change and bias fold into the last pass.  (The
                  unfused composition, im2col + the hand-written GEMM, was a rung of its own:
                  77-88% of v3's speed.)
  v7_winograd     Winograd's minimal filtering, F(4x4, r x r) (kernels/winograd.py): input tiles
                  and filters transformed, alpha^2 = (4 + r - 1)^2 GEMMs over channels, the
                  output transformed back; 64 multiplies per 16 outputs of a 5x5 kernel instead
                  of 400.  Stride 1, no dilation, square 3x3 or 5x5 kernels (other geometry runs
                  v3_im2col_blas); float32 results within a few 1e-6 of max|y|, not the direct
                  sum's rounding (docs/KERNELS.md, "Winograd").  Both backward passes too.
  v5_implicit_prange  v4 with the image blocks split across cores by prange: per-image
                  parallelism, the form a training step can use when one process trains.  Safe
                  from several Python threads only under a threading layer that allows
                  concurrent parallel regions (NUMBA_THREADING_LAYER=omp; numba's default
                  workqueue layer aborts), so opt-in like every prange rung.
"""

import numpy as np
from numba import njit, prange

from . import _versions
from . import gemm as _gemm
from . import im2col as _im2col
from . import winograd as _winograd

_U = np.uint64  # unsigned flat offsets: no negative-index fix-up on each access (kernels/im2col.py)

__all__ = [
    "conv_fwd",
    "conv_bwd_data",
    "conv_bwd_filter",
    "conv_fwd_reference",
    "conv_bwd_data_reference",
    "conv_bwd_filter_reference",
    "VERSIONS",
    "DEFAULTS",
    "use",
]


def conv_fwd_reference(x, w, bias, ph, pw, sh, sw, dh, dw):
    """float64 y by summing shifted, strided slices of the padded input (one per (c, i, j)
    tap, contracted over c with einsum): independent of im2col and of the loops below."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((N, M, OH, OW))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw]
            y += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    if np.size(bias):
        y += np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return y


def conv_bwd_data_reference(dy, w, ph, pw, sh, sw, dh, dw, x_shape):
    """float64 dx: the adjoint of conv_fwd_reference, tap by tap (independent of col2im)."""
    dy = np.asarray(dy, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, C, H, W = x_shape
    M, _, kh, kw = w.shape
    OH, OW = dy.shape[2], dy.shape[3]
    dxp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw] += np.einsum(
                "nmhw,mc->nchw", dy, w[:, :, i, j]
            )
    return dxp[:, :, ph : ph + H, pw : pw + W]


def conv_bwd_filter_reference(x, dy, ph, pw, sh, sw, dh, dw, w_shape):
    """float64 dW, tap by tap: dW[m, c, i, j] = sum over (n, oh, ow) of dy * the input pixel."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    M, C, kh, kw = w_shape
    OH, OW = dy.shape[2], dy.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros(w_shape)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh : i * dh + sh * (OH - 1) + 1 : sh, j * dw : j * dw + sw * (OW - 1) + 1 : sw]
            out[:, :, i, j] = np.einsum("nmhw,nchw->mc", dy, patch)
    return out


@njit(nogil=True, cache=True)
def _geometry(x, w, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W = x.shape
    M, C2, kh, kw = w.shape
    OH = _im2col.out_size(H, kh, ph, sh, dh)
    OW = _im2col.out_size(W, kw, pw, sw, dw)
    if C2 != C or y.shape[0] != N or y.shape[1] != M or y.shape[2] != OH or y.shape[3] != OW:
        raise ValueError("conv_fwd: w must be (M, C, kh, kw) and y (N, M, OH, OW)")
    return N, C, H, W, M, kh, kw, OH, OW


@njit(nogil=True, cache=True)
def conv_fwd_v1_naive(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    for n in range(N):
        for m in range(M):
            for oh in range(OH):
                for ow in range(OW):
                    s = y.dtype.type(bias[m]) if bias.size else y.dtype.type(0)
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                ih = oh * sh - ph + i * dh
                                iw = ow * sw - pw + j * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    s += w[m, c, i, j] * x[n, c, ih, iw]
                    y[n, m, oh, ow] = s


@njit(nogil=True, cache=True, fastmath={"contract"})
def conv_fwd_v2_direct(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    oh_rng, ow_rng = _im2col._ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    for n in range(N):
        for m in range(M):
            ym = y[n, m]
            ym[...] = bias[m] if bias.size else 0
            for c in range(C):
                xc = x[n, c]
                for i in range(kh):
                    for j in range(kw):
                        wv = w[m, c, i, j]
                        lo, hi = ow_rng[j, 0], ow_rng[j, 1]
                        off = j * dw - pw
                        for oh in range(oh_rng[i, 0], oh_rng[i, 1]):
                            xr = xc[oh * sh - ph + i * dh]
                            yr = ym[oh]
                            if sw == 1:
                                for ow in range(lo, hi):
                                    yr[ow] += wv * xr[ow + off]
                            else:
                                for ow in range(lo, hi):
                                    yr[ow] += wv * xr[ow * sw + off]


def _make_im2col_gemm(gemm_fn, name):
    def conv_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
        N, C, H, W = x.shape
        M, _, kh, kw = w.shape
        OH, OW = y.shape[2], y.shape[3]
        col = np.empty((C * kh * kw, N * OH * OW), x.dtype)
        _im2col.im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
        out = np.empty((M, N * OH * OW), y.dtype)
        gemm_fn(False, False, 1.0, w.reshape(M, C * kh * kw), col, 0.0, out)
        yv = y.reshape(N, M, OH * OW)
        yv[...] = out.reshape(M, N, OH * OW).transpose(1, 0, 2)
        if np.size(bias):
            yv += bias[None, :, None]

    conv_fwd.__name__ = name
    return conv_fwd


conv_fwd_v3_im2col_blas = _make_im2col_gemm(_gemm.gemm_blas, "conv_fwd_v3_im2col_blas")

# -- v4: implicit GEMM (im2col fused into the GEMM's packing) ---------------------------------------
_KB, _NB = _gemm.KB, _gemm.NB  # rows of col per pass, columns per block: the AXPY kernel's blocks


@njit(nogil=True, cache=True)
def _pack_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, n1, p0, p1, OW, P, buf):
    """The packing both implicit GEMMs share: rows p0..p1 of im2col's column matrix, for images
    n0..n1-1, unrolled into ``buf`` (row r - p0, image n at column (n - n0) * P)."""
    N, C, H, W = x.shape
    stride = buf.shape[1]
    xf = x.reshape(x.size)
    bf = buf.reshape(buf.size)
    z = buf.dtype.type(0)
    for r in range(p0, p1):
        c = r // (kh * kw)
        i = (r // kw) % kh
        j = r % kw
        for n in range(n0, n1):
            s0 = (n * C + c) * H * W + (i * dh - ph) * W + (j * dw - pw)
            _im2col._im2col_tap_flat(
                xf,
                s0,
                bf,
                (r - p0) * stride + (n - n0) * P,
                sh,
                sw,
                W,
                OW,
                P,
                oh_rng[i, 0],
                oh_rng[i, 1],
                ow_rng[j, 0],
                ow_rng[j, 1],
                z,
            )


@njit(nogil=True, cache=True, fastmath={"contract"})
def _implicit_images(x, w2, bias, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, n1, buf, out, y):
    """y[n0:n1] for images n0..n1-1: out (M, (n1-n0)*P) = w2 @ col[:, block] computed KB rows
    of col at a time, each unrolled into ``buf`` (KB, >= (n1-n0)*P) just before it is used."""
    M, K = w2.shape
    OH, OW = y.shape[2], y.shape[3]
    P = OH * OW
    nb = (n1 - n0) * P
    out[:, :nb] = 0
    for p0 in range(0, K, _KB):
        p1 = min(p0 + _KB, K)
        # the packing: im2col of rows p0..p1 of this block
        _pack_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, n1, p0, p1, OW, P, buf)
        _gemm._axpy_block(out.dtype.type(1), w2[:, p0:p1], False, buf, out, 0, nb, 0, p1 - p0)
    for n in range(n0, n1):  # the epilogue: NCHW and the bias
        for m in range(M):
            ym = y[n, m].reshape(P)
            src = out[m, (n - n0) * P : (n - n0 + 1) * P]
            b = bias[m] if bias.size else out.dtype.type(0)
            for q in range(P):
                ym[q] = src[q] + b


@njit(nogil=True, cache=True)
def _implicit_setup(x, w, ph, pw, sh, sw, dh, dw, y):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    oh_rng, ow_rng = _im2col._ranges(kh, kw, ph, pw, sh, sw, dh, dw, H, W, OH, OW)
    per = max(1, _NB // (OH * OW))  # whole images per block
    return per, oh_rng, ow_rng


@njit(nogil=True, cache=True)
def conv_fwd_v4_implicit(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    per, oh_rng, ow_rng = _implicit_setup(x, w, ph, pw, sh, sw, dh, dw, y)
    M, C, kh, kw = w.shape
    N = x.shape[0]
    P = y.shape[2] * y.shape[3]
    w2 = w.reshape(M, C * kh * kw)
    buf = np.empty((min(_KB, C * kh * kw), per * P), y.dtype)
    out = np.empty((M, per * P), y.dtype)
    for n0 in range(0, N, per):
        _implicit_images(x, w2, bias, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, min(n0 + per, N), buf, out, y)


@njit(nogil=True, cache=True, parallel=True)
def conv_fwd_v5_implicit_prange(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    per, oh_rng, ow_rng = _implicit_setup(x, w, ph, pw, sh, sw, dh, dw, y)
    M, C, kh, kw = w.shape
    N = x.shape[0]
    P = y.shape[2] * y.shape[3]
    w2 = w.reshape(M, C * kh * kw)
    for blk in prange((N + per - 1) // per):  # each thread: its own buffers, its own images
        n0 = blk * per
        buf = np.empty((min(_KB, C * kh * kw), per * P), y.dtype)
        out = np.empty((M, per * P), y.dtype)
        _implicit_images(x, w2, bias, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, min(n0 + per, N), buf, out, y)


# -- conv_bwd_data: the gradient to the input ---------------------------------------------------------
@njit(nogil=True, cache=True)
def conv_bwd_data_v1_naive(dy, w, ph, pw, sh, sw, dh, dw, dx):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(dx, w, ph, pw, sh, sw, dh, dw, dy)
    dx[...] = 0
    for n in range(N):
        for m in range(M):
            for oh in range(OH):
                for ow in range(OW):
                    g = dy[n, m, oh, ow]
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                ih = oh * sh - ph + i * dh
                                iw = ow * sw - pw + j * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    dx[n, c, ih, iw] += w[m, c, i, j] * g


def conv_bwd_data_v3_im2col_blas(dy, w, ph, pw, sh, sw, dh, dw, dx):
    """dcol = W^T @ dY (BLAS, dY moved to (M, N*OH*OW) first), then col2im (the default numba
    kernel): what the engine's ConvolutionLayer does."""
    N, M, OH, OW = dy.shape
    _, C, kh, kw = w.shape
    dym = np.ascontiguousarray(dy.reshape(N, M, OH * OW).transpose(1, 0, 2)).reshape(M, N * OH * OW)
    dcol = np.empty((C * kh * kw, N * OH * OW), dx.dtype)
    _gemm.gemm_blas(True, False, 1.0, w.reshape(M, C * kh * kw), dym, 0.0, dcol)
    _im2col.col2im(dcol, kh, kw, ph, pw, sh, sw, dh, dw, dx)


@njit(nogil=True, cache=True, fastmath={"contract"})
def _implicit_bwd_images(dy, w2, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, n1, dyb, buf, dx):
    """dx[n0:n1] from dy[n0:n1]: dY's block packed as (M, nb) in ``dyb``, then per KB rows of
    dcol: buf = W^T[rows] @ dyb (the AXPY kernel), put back into dx at once (col2im's tap)."""
    N, C, H, W = dx.shape
    M, K = w2.shape
    OH, OW = dy.shape[2], dy.shape[3]
    P = OH * OW
    nb = (n1 - n0) * P
    stride = buf.shape[1]
    for n in range(n0, n1):  # pack dY's block: (images, M, P) -> (M, images * P)
        for m in range(M):
            dyb[m, (n - n0) * P : (n - n0 + 1) * P] = dy[n, m].reshape(P)
        dx[n] = 0
    xf = dx.reshape(dx.size)
    bf = buf.reshape(buf.size)
    for p0 in range(0, K, _KB):
        p1 = min(p0 + _KB, K)
        buf[: p1 - p0, :nb] = 0
        _gemm._axpy_block(buf.dtype.type(1), w2[:, p0:p1], True, dyb, buf, 0, nb, 0, M)
        for r in range(p0, p1):  # the epilogue: col2im of these rows, while they are in cache
            c = r // (kh * kw)
            i = (r // kw) % kh
            j = r % kw
            for n in range(n0, n1):
                s0 = (n * C + c) * H * W + (i * dh - ph) * W + (j * dw - pw)
                _im2col._col2im_tap_flat(
                    bf,
                    (r - p0) * stride + (n - n0) * P,
                    xf,
                    s0,
                    sh,
                    sw,
                    W,
                    OW,
                    oh_rng[i, 0],
                    oh_rng[i, 1],
                    ow_rng[j, 0],
                    ow_rng[j, 1],
                )


@njit(nogil=True, cache=True)
def conv_bwd_data_v4_implicit(dy, w, ph, pw, sh, sw, dh, dw, dx):
    per, oh_rng, ow_rng = _implicit_setup(dx, w, ph, pw, sh, sw, dh, dw, dy)
    M, C, kh, kw = w.shape
    N = dx.shape[0]
    P = dy.shape[2] * dy.shape[3]
    w2 = w.reshape(M, C * kh * kw)
    dyb = np.empty((M, per * P), dx.dtype)
    buf = np.empty((min(_KB, C * kh * kw), per * P), dx.dtype)
    for n0 in range(0, N, per):
        _implicit_bwd_images(dy, w2, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, min(n0 + per, N), dyb, buf, dx)


# -- conv_bwd_filter: the gradient to the weights ---------------------------------------------------------
@njit(nogil=True, cache=True)
def conv_bwd_filter_v1_naive(x, dy, ph, pw, sh, sw, dh, dw, dwt):
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, dwt, ph, pw, sh, sw, dh, dw, dy)
    dwt[...] = 0
    for n in range(N):
        for m in range(M):
            for oh in range(OH):
                for ow in range(OW):
                    g = dy[n, m, oh, ow]
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                ih = oh * sh - ph + i * dh
                                iw = ow * sw - pw + j * dw
                                if 0 <= ih < H and 0 <= iw < W:
                                    dwt[m, c, i, j] += g * x[n, c, ih, iw]


def conv_bwd_filter_v3_im2col_blas(x, dy, ph, pw, sh, sw, dh, dw, dwt):
    """im2col, then dW = dY @ col^T by BLAS (dY moved to (M, N*OH*OW) first)."""
    N, M, OH, OW = dy.shape
    _, C, kh, kw = dwt.shape
    col = np.empty((C * kh * kw, N * OH * OW), x.dtype)
    _im2col.im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    dym = np.ascontiguousarray(dy.reshape(N, M, OH * OW).transpose(1, 0, 2)).reshape(M, N * OH * OW)
    _gemm.gemm_blas(False, True, 1.0, dym, col, 0.0, dwt.reshape(M, C * kh * kw))


@njit(nogil=True, cache=True)
def _pack_dy(dy, n0, n1, dyb):
    """dyb[:, :(n1-n0)*P] = dY's images n0..n1 as an (M, images * P) matrix."""
    M = dy.shape[1]
    P = dy.shape[2] * dy.shape[3]
    for n in range(n0, n1):
        for m in range(M):
            dyb[m, (n - n0) * P : (n - n0 + 1) * P] = dy[n, m].reshape(P)


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def conv_bwd_filter_v4_implicit(x, dy, ph, pw, sh, sw, dh, dw, dwt):
    per, oh_rng, ow_rng = _implicit_setup(x, dwt, ph, pw, sh, sw, dh, dw, dy)
    N, C = x.shape[0], x.shape[1]
    M, _, kh, kw = dwt.shape
    K = C * kh * kw
    OW = dy.shape[3]
    P = dy.shape[2] * OW
    dw2 = dwt.reshape(M, K)
    dw2[...] = 0
    dyb = np.empty((M, per * P), x.dtype)
    buf = np.empty((min(_KB, K), per * P), x.dtype)
    one = buf.dtype.type(1)
    for n0 in range(0, N, per):
        n1 = min(n0 + per, N)
        nb = (n1 - n0) * P
        _pack_dy(dy, n0, n1, dyb)
        for p0 in range(0, K, _KB):
            p1 = min(p0 + _KB, K)
            # col's rows p0..p1 for this block, as the forward makes them
            _pack_rows(x, kh, kw, ph, pw, sh, sw, dh, dw, oh_rng, ow_rng, n0, n1, p0, p1, OW, P, buf)
            # dW[:, p0:p1] += dYb @ colblk^T: a long k (the block's pixels), the dot-product form
            _gemm._gemm_micro_cols(one, dyb[:, :nb], False, buf[: p1 - p0, :nb], True, dw2[:, p0:p1], 0, p1 - p0)


# -- v6: direct convolution over shifted planes (few input channels: LeNet's conv1) -------------------
# Output pixel (oh, ow) of tap (c, i, j) reads the padded input at row oh*sh + i*dh, column
# ow*sw + j*dw.  Each image is first copied into "shifted planes": plane (j, b, c) holds, at
# row r and column ow, the padded input's row r*sh + b and column ow*sw + j*dw -- channel c
# shifted left by the tap's column and sampled at the stride, so its rows are exactly as wide
# as the output.  Writing i*dh = a*sh + b, tap (c, i, j) then reads plane (j, b, c) at row
# oh + a, column ow: flat position off[c, i, j] + q, where q = oh*OW + ow runs over the output
# itself.  So each tap is one long AXPY over all OH*OW outputs of an image,
#     y[n, m, q] += w[m, tap] * planes[off[tap] + q],
# not a row of 8-24 values as in v2, with no column matrix and no GEMM: the planes are
# kw*sh*C rows of OW per output row (LeNet's conv1: 5 planes of 28 x 24, 13 KB an image,
# against im2col's 25 x 576 columns).  The weight gradient is the same read turned into dot
# products: dW[m, tap] += dot(dy[n, m, :], planes[off[tap] :]).
# (The first form read the padded image itself, q = oh*Wp + ow, so its output grid was as wide
# as the padded input: LeNet's conv1 computed 672 outputs for 576 and a stride s > 1 took s*s
# the work; its forward then copied the valid columns out and its backward spread dy onto the
# wide grid.  docs/KERNELS.md has both.)


@njit(nogil=True, cache=True)
def _shifted_setup(C, H, W, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW):
    """The planes' rows Hs (OH plus the rows the lowest tap reaches below), each tap's flat
    offset into the planes, and the planes' size.  The taps are taken a kernel column at a
    time, tap t = (c*kw + j)*kh + i, so the five taps of one AXPY pass read one plane at five
    rows' offsets (one stream, in L1) rather than five planes."""
    Hs = OH + dh * (kh - 1) // sh
    offs = np.empty(C * kh * kw, np.int64)
    for c in range(C):
        for j in range(kw):
            for i in range(kh):
                a, b = divmod(i * dh, sh)
                offs[(c * kw + j) * kh + i] = (((j * sh + b) * C + c) * Hs + a) * OW
    return Hs, offs, kw * sh * C * Hs * OW


@njit(nogil=True, cache=True)
def _tap(c, i, j, kh, kw):
    """Tap (c, i, j)'s place in the taps' order (see _shifted_setup)."""
    return (c * kw + j) * kh + i


@njit(nogil=True, cache=True)
def _shifted_planes(x, n, ph, pw, sh, sw, dw, kw, Hs, OW, xs):
    """xs = image n of x as the shifted planes (see above): plane (j, b, c) row r is the
    padded input's row r*sh + b from column j*dw on, every sw-th value, zero where that lies
    in the padding.  Flat indices, no view per row."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    xf = x.reshape(x.size)
    for j in range(kw):
        # the columns ow whose input column ow*sw + j*dw - pw lies inside the image: [lo, hi)
        lo = min(OW, max(0, -(-(pw - j * dw) // sw)))
        hi = max(lo, min(OW, (W - 1 + pw - j * dw) // sw + 1))
        for b in range(sh):
            for c in range(C):
                for r in range(Hs):
                    o = _U((((j * sh + b) * C + c) * Hs + r) * OW)
                    h = r * sh + b - ph
                    if h < 0 or h >= H:
                        for k in range(_U(OW)):
                            xs[o + k] = 0
                        continue
                    for k in range(_U(lo)):
                        xs[o + k] = 0
                    s = ((n * C + c) * H + h) * W + j * dw - pw  # input column of ow = 0 (may be < 0)
                    if sw == 1:  # unit stride: a copy LLVM vectorizes
                        for k in range(_U(lo), _U(hi)):
                            xs[o + k] = xf[_U(s + k)]
                    else:
                        for k in range(lo, hi):
                            xs[o + _U(k)] = xf[_U(s + k * sw)]
                    for k in range(_U(hi), _U(OW)):
                        xs[o + k] = 0


@njit(nogil=True, cache=True, fastmath={"contract"})
def _shifted_axpy(w4, b4, i0, offs, xs, out, L):
    """out[k, :L] = b4[i0 + k] + sum over taps t of w4[i0 + k, t] * xs[offs[t] : offs[t] + L]
    for k < 4: kernels.gemm's AXPY kernel with B's rows the shifted planes, four rows of out and
    five taps (a 5x5 kernel's column) per pass, so each vector load and store of out carries five
    FMAs and each load of the planes four.  The first pass writes out (the bias plus its five
    taps) instead of adding to it; the last T % 5 taps go one at a time.  The four rows (4 x L
    values: 9 KB for LeNet's conv1) stay in L1 across all the taps.  (Four taps per pass and a
    clearing pass, the first form, took 1.45x as long on conv1.)"""
    T = w4.shape[1]
    t5 = T - T % 5
    c0, c1, c2, c3 = out[0, :L], out[1, :L], out[2, :L], out[3, :L]
    i1, i2, i3 = i0 + 1, i0 + 2, i0 + 3
    if t5 == 0:
        c0[:], c1[:], c2[:], c3[:] = b4[i0], b4[i1], b4[i2], b4[i3]
    for t in range(0, t5, 5):
        b0, b1 = xs[offs[t] : offs[t] + L], xs[offs[t + 1] : offs[t + 1] + L]
        b2, b3 = xs[offs[t + 2] : offs[t + 2] + L], xs[offs[t + 3] : offs[t + 3] + L]
        b4_ = xs[offs[t + 4] : offs[t + 4] + L]
        x00, x01, x02, x03, x04 = w4[i0, t], w4[i0, t + 1], w4[i0, t + 2], w4[i0, t + 3], w4[i0, t + 4]
        x10, x11, x12, x13, x14 = w4[i1, t], w4[i1, t + 1], w4[i1, t + 2], w4[i1, t + 3], w4[i1, t + 4]
        x20, x21, x22, x23, x24 = w4[i2, t], w4[i2, t + 1], w4[i2, t + 2], w4[i2, t + 3], w4[i2, t + 4]
        x30, x31, x32, x33, x34 = w4[i3, t], w4[i3, t + 1], w4[i3, t + 2], w4[i3, t + 3], w4[i3, t + 4]
        if t == 0:
            d0, d1, d2, d3 = b4[i0], b4[i1], b4[i2], b4[i3]
            for q in range(L):
                u, v, s, z, e = b0[q], b1[q], b2[q], b3[q], b4_[q]
                c0[q] = d0 + x00 * u + x01 * v + x02 * s + x03 * z + x04 * e
                c1[q] = d1 + x10 * u + x11 * v + x12 * s + x13 * z + x14 * e
                c2[q] = d2 + x20 * u + x21 * v + x22 * s + x23 * z + x24 * e
                c3[q] = d3 + x30 * u + x31 * v + x32 * s + x33 * z + x34 * e
        else:
            for q in range(L):
                u, v, s, z, e = b0[q], b1[q], b2[q], b3[q], b4_[q]
                c0[q] += x00 * u + x01 * v + x02 * s + x03 * z + x04 * e
                c1[q] += x10 * u + x11 * v + x12 * s + x13 * z + x14 * e
                c2[q] += x20 * u + x21 * v + x22 * s + x23 * z + x24 * e
                c3[q] += x30 * u + x31 * v + x32 * s + x33 * z + x34 * e
    for t in range(t5, T):  # the last T % 5 taps, one at a time
        b0 = xs[offs[t] : offs[t] + L]
        x00, x10, x20, x30 = w4[i0, t], w4[i1, t], w4[i2, t], w4[i3, t]
        for q in range(L):
            u = b0[q]
            c0[q] += x00 * u
            c1[q] += x10 * u
            c2[q] += x20 * u
            c3[q] += x30 * u


@njit(nogil=True, cache=True)
def _rows_alias(L, itemsize):
    """Would four rows L values apart have two whose addresses agree in their low 12 bits (to
    within a cache line)?  Then a load from one row waits on the stores to another ("4K
    aliasing", the likely cause): CIFAR-10 quick's conv1 (rows of 1024 floats) ran its forward
    in 3.96 ms straight into y's rows, 3.40 through a buffer with a padded row stride."""
    for d in range(1, 4):
        r = d * L * itemsize % 4096
        if r < 64 or r > 4096 - 64:
            return True
    return False


@njit(nogil=True, cache=True)
def shifted_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    """y = conv(x, w) + bias for every image of x: the v6 forward (bias (M,) or (0,) for none).
    Four output channels at a time are computed straight into y's rows (an image's (M, OH*OW)
    block is contiguous), unless those rows alias (_rows_alias) or it is a last group of
    M % 4 channels: then into a small buffer with a padded row stride, copied out."""
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, w, ph, pw, sh, sw, dh, dw, y)
    Hs, offs, ns = _shifted_setup(C, H, W, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
    L = OH * OW
    M4 = (M + 3) // 4 * 4
    w4 = np.zeros((M4, C * kh * kw), y.dtype)  # the weights in the taps' order, zero past M: four rows per pass
    for m in range(M):
        for c in range(C):
            for i in range(kh):
                for j in range(kw):
                    w4[m, _tap(c, i, j, kh, kw)] = w[m, c, i, j]
    b4 = np.zeros(M4, y.dtype)
    if bias.size:
        b4[:M] = bias
    xs = np.empty(ns, y.dtype)
    alias = _rows_alias(L, y.itemsize)
    acc = np.empty((4, L + 32 if alias else L), y.dtype)
    y3 = y.reshape(N, M, L)
    for n in range(N):
        _shifted_planes(x, n, ph, pw, sh, sw, dw, kw, Hs, OW, xs)
        for i0 in range(0, M, 4):
            if i0 + 4 <= M and not alias:
                _shifted_axpy(w4, b4, i0, offs, xs, y3[n, i0 : i0 + 4], L)
            else:
                _shifted_axpy(w4, b4, i0, offs, xs, acc, L)
                i1 = min(M, i0 + 4)
                y3[n, i0:i1] = acc[: i1 - i0, :L]


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _shifted_dots(g, offs, xs, L, dw2):
    """dw2[m, t] += dot(g[m, :L], xs[offs[t] : offs[t] + L]): the weight gradient of one image,
    four rows of g and three taps per pass (12 accumulators, as kernels.gemm's micro-kernel;
    reassociation lets LLVM vectorize each along q)."""
    M, T = dw2.shape
    t3 = T - T % 3
    for i0 in range(0, M, 4):
        r = min(4, M - i0)
        i1, i2, i3 = i0 + min(1, r - 1), i0 + min(2, r - 1), i0 + min(3, r - 1)
        g0, g1, g2, g3 = g[i0, :L], g[i1, :L], g[i2, :L], g[i3, :L]
        for t in range(0, T, 3):
            n3 = 3 if t < t3 else T - t
            b0 = xs[offs[t] : offs[t] + L]
            b1 = xs[offs[t + min(1, n3 - 1)] : offs[t + min(1, n3 - 1)] + L]
            b2 = xs[offs[t + min(2, n3 - 1)] : offs[t + min(2, n3 - 1)] + L]
            z = dw2.dtype.type(0)
            s00 = s01 = s02 = s10 = s11 = s12 = s20 = s21 = s22 = s30 = s31 = s32 = z
            for q in range(L):
                u, v, e = b0[q], b1[q], b2[q]
                a, b, c, d = g0[q], g1[q], g2[q], g3[q]
                s00 += a * u
                s01 += a * v
                s02 += a * e
                s10 += b * u
                s11 += b * v
                s12 += b * e
                s20 += c * u
                s21 += c * v
                s22 += c * e
                s30 += d * u
                s31 += d * v
                s32 += d * e
            dw2[i0, t] += s00
            if r > 1:
                dw2[i1, t] += s10
            if r > 2:
                dw2[i2, t] += s20
            if r > 3:
                dw2[i3, t] += s30
            if n3 > 1:
                dw2[i0, t + 1] += s01
                if r > 1:
                    dw2[i1, t + 1] += s11
                if r > 2:
                    dw2[i2, t + 1] += s21
                if r > 3:
                    dw2[i3, t + 1] += s31
            if n3 > 2:
                dw2[i0, t + 2] += s02
                if r > 1:
                    dw2[i1, t + 2] += s12
                if r > 2:
                    dw2[i2, t + 2] += s22
                if r > 3:
                    dw2[i3, t + 2] += s32


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
def _row_sum(a, lo, hi):
    """sum(a[lo:hi]), reassociated so LLVM vectorizes it (a plain += chain is one add per
    cycle-latency: 4 cycles a value)."""
    s = a.dtype.type(0)
    for q in range(_U(lo), _U(hi)):
        s += a[q]
    return s


@njit(nogil=True, cache=True)
def shifted_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, db):
    """dwt (M, C, kh, kw) += the weight gradient and db (M,) += the bias gradient (db of size 0:
    none) over every image: the v6 backward, accumulating as Caffe's parameter diffs do.  An
    image's dy rows are already laid out as the planes' output grid, so each (m, tap) is one
    dot product over the whole image, read where dy lies; db is the sum of each row."""
    N, C, H, W, M, kh, kw, OH, OW = _geometry(x, dwt, ph, pw, sh, sw, dh, dw, dy)
    Hs, offs, ns = _shifted_setup(C, H, W, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
    L = OH * OW
    dw2 = np.zeros((M, C * kh * kw), dwt.dtype)  # the gradient in the taps' order
    xs = np.empty(ns, x.dtype)
    dy3, dyf = dy.reshape(N, M, L), dy.reshape(dy.size)
    for n in range(N):
        _shifted_planes(x, n, ph, pw, sh, sw, dw, kw, Hs, OW, xs)
        if db.size:
            for m in range(M):
                db[m] += _row_sum(dyf, (n * M + m) * L, (n * M + m + 1) * L)
        _shifted_dots(dy3[n], offs, xs, L, dw2)
    for m in range(M):
        for c in range(C):
            for i in range(kh):
                for j in range(kw):
                    dwt[m, c, i, j] += dw2[m, _tap(c, i, j, kh, kw)]


def _winograd_ok(w, sh, sw, dh, dw):
    """F(4x4, r x r) applies (kernels/winograd.py): square kernel, stride 1, no dilation."""
    kh, kw = w.shape[2], w.shape[3]
    return _winograd.supported(kh, kw, sh, sw, dh, dw, _winograd.tile_for(kh))


def conv_fwd_v7_winograd(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    """Winograd F(4x4, r x r) where it applies (else v3_im2col_blas): kernels/winograd.py."""
    if not _winograd_ok(w, sh, sw, dh, dw):
        return conv_fwd_v3_im2col_blas(x, w, bias, ph, pw, sh, sw, dh, dw, y)
    _winograd.fwd(x, w, bias, ph, pw, y, _winograd.tile_for(w.shape[2]))


def conv_bwd_data_v7_winograd(dy, w, ph, pw, sh, sw, dh, dw, dx):
    if not _winograd_ok(w, sh, sw, dh, dw):
        return conv_bwd_data_v3_im2col_blas(dy, w, ph, pw, sh, sw, dh, dw, dx)
    _winograd.bwd_data(dy, w, ph, pw, dx, _winograd.tile_for(w.shape[2]))


def conv_bwd_filter_v7_winograd(x, dy, ph, pw, sh, sw, dh, dw, dwt):
    if not _winograd_ok(dwt, sh, sw, dh, dw):
        return conv_bwd_filter_v3_im2col_blas(x, dy, ph, pw, sh, sw, dh, dw, dwt)
    _winograd.bwd_filter(x, dy, ph, pw, dwt, _winograd.tile_for(dwt.shape[2]))


def conv_fwd_v6_shifted(x, w, bias, ph, pw, sh, sw, dh, dw, y):
    shifted_fwd(x, w, bias, ph, pw, sh, sw, dh, dw, y)


def conv_bwd_filter_v6_shifted(x, dy, ph, pw, sh, sw, dh, dw, dwt):
    dwt[...] = 0
    shifted_bwd_filter(x, dy, ph, pw, sh, sw, dh, dw, dwt, dwt[:0, 0, 0, 0])


VERSIONS = {
    "conv_fwd": {
        "v1_naive": conv_fwd_v1_naive,
        "v2_direct": conv_fwd_v2_direct,
        "v3_im2col_blas": conv_fwd_v3_im2col_blas,
        "v4_implicit": conv_fwd_v4_implicit,
        "v5_implicit_prange": conv_fwd_v5_implicit_prange,
        "v6_shifted": conv_fwd_v6_shifted,
        "v7_winograd": conv_fwd_v7_winograd,
    },
    "conv_bwd_data": {
        "v1_naive": conv_bwd_data_v1_naive,
        "v3_im2col_blas": conv_bwd_data_v3_im2col_blas,
        "v4_implicit": conv_bwd_data_v4_implicit,
        "v7_winograd": conv_bwd_data_v7_winograd,
    },
    "conv_bwd_filter": {
        "v1_naive": conv_bwd_filter_v1_naive,
        "v3_im2col_blas": conv_bwd_filter_v3_im2col_blas,
        "v4_implicit": conv_bwd_filter_v4_implicit,
        "v6_shifted": conv_bwd_filter_v6_shifted,
        "v7_winograd": conv_bwd_filter_v7_winograd,
    },
}
DEFAULTS = {"conv_fwd": "v3_im2col_blas", "conv_bwd_data": "v3_im2col_blas", "conv_bwd_filter": "v3_im2col_blas"}
REFERENCES = {
    "conv_fwd": conv_fwd_reference,
    "conv_bwd_data": conv_bwd_data_reference,
    "conv_bwd_filter": conv_bwd_filter_reference,
}

conv_fwd = VERSIONS["conv_fwd"][DEFAULTS["conv_fwd"]]
conv_bwd_data = VERSIONS["conv_bwd_data"][DEFAULTS["conv_bwd_data"]]
conv_bwd_filter = VERSIONS["conv_bwd_filter"][DEFAULTS["conv_bwd_filter"]]


def use(version):
    """Bind the three conv kernels to ``version`` where they have it (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("conv")


# -- self-check and benchmark: python -m kernels.conv --------------------------------------------
def _winograd_bench(x, w, bias, p, y_shape, dy=None):
    """v7's check tolerances (the algorithm's rounding bound, kernels/winograd.py) for (y, dx,
    dW) and its operation counts, for one benchmark case."""
    m = _winograd.tile_for(w.shape[2])
    T = x.shape[0] * -(-y_shape[2] // m) * -(-y_shape[3] // m)
    n = _winograd.roundings(x.shape[1], w.shape[0], T, m, w.shape[2]) + 2
    mags = _winograd.reference(x, w, p, p, m, dy, magnitude=True)
    mags = [mags[0] + np.abs(bias.astype(np.float64))[None, :, None, None], mags[1], mags[2]]  # bias added last
    tols = [None if g is None else n * float(np.finfo(np.float32).eps) * g + 1e-30 for g in mags]
    ops = {k: _winograd.flops(x.shape, w.shape, p, p, m, k) for k in ("fwd", "bwd_data", "bwd_filter")}
    return tols, ops


def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.conv``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import conv as CV

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(1)
    shapes = [("LeNet conv1", (64, 1, 28, 28), (20, 1, 5, 5), 0), ("LeNet conv2", (64, 20, 12, 12), (50, 20, 5, 5), 0)]
    if not quick:
        shapes += [("CIFAR conv2", (100, 32, 16, 16), (32, 32, 5, 5), 2)]
    cases = []
    for name, xs, ws, p in shapes:
        x = rng.standard_normal(xs).astype(F32)
        w = rng.standard_normal(ws).astype(F32)
        bias = rng.standard_normal(ws[0]).astype(F32)
        OH = xs[2] + 2 * p - ws[2] + 1
        y = np.empty((xs[0], ws[0], OH, OH), F32)
        ref = CV.conv_fwd_reference(x, w, bias, p, p, 1, 1, 1, 1)
        mag = CV.conv_fwd_reference(np.abs(x), np.abs(w), np.abs(bias), p, p, 1, 1, 1, 1)
        K = ws[1] * ws[2] * ws[3]

        def run(fn, x=x, w=w, bias=bias, y=y, p=p):
            return lambda: fn(x, w, bias, p, p, 1, 1, 1, 1, y)

        wino = _winograd_bench(x, w, bias, p, ref.shape)

        def check(fn, y=y, ref=ref, mag=mag, K=K, wino=wino):
            close(y, ref, wino[0][0] if fn is CV.conv_fwd_v7_winograd else sum_tol(K, mag), "conv_fwd")

        flops = 2.0 * y.size * K
        cases.append(
            Case(
                "conv",
                "conv_fwd",
                f"{name} x{xs} w{ws}",
                "compute",
                flops,
                4.0 * (x.size + w.size + y.size),
                run,
                check,
                flops_of={"v7_winograd": wino[1]["fwd"]},
            )
        )
        dy = rng.standard_normal(y.shape).astype(F32)
        dx = np.empty(xs, F32)
        dref = CV.conv_bwd_data_reference(dy, w, p, p, 1, 1, 1, 1, xs)
        dmag = CV.conv_bwd_data_reference(np.abs(dy), np.abs(w), p, p, 1, 1, 1, 1, xs)

        def run_b(fn, dy=dy, w=w, dx=dx, p=p):
            return lambda: fn(dy, w, p, p, 1, 1, 1, 1, dx)

        wino = _winograd_bench(x, w, bias, p, ref.shape, dy)

        def check_b(fn, dx=dx, dref=dref, dmag=dmag, K=K, wino=wino):
            close(dx, dref, wino[0][1] if fn is CV.conv_bwd_data_v7_winograd else sum_tol(K, dmag), "conv_bwd_data")

        fref = CV.conv_bwd_filter_reference(x, dy, p, p, 1, 1, 1, 1, ws)
        fmag = CV.conv_bwd_filter_reference(np.abs(x), np.abs(dy), p, p, 1, 1, 1, 1, ws)
        dwt = np.empty(ws, F32)

        def run_f(fn, x=x, dy=dy, dwt=dwt, p=p):
            return lambda: fn(x, dy, p, p, 1, 1, 1, 1, dwt)

        def check_f(fn, dwt=dwt, fref=fref, fmag=fmag, n=y.size // ws[0], wino=wino):
            tol = wino[0][2] if fn is CV.conv_bwd_filter_v7_winograd else sum_tol(n, fmag)
            close(dwt, fref, tol, "conv_bwd_filter")

        cases.append(
            Case(
                "conv",
                "conv_bwd_filter",
                f"{name} x{xs} w{ws}",
                "compute",
                flops,
                4.0 * (x.size + w.size + y.size),
                run_f,
                check_f,
                flops_of={"v7_winograd": wino[1]["bwd_filter"]},
            )
        )
        cases.append(
            Case(
                "conv",
                "conv_bwd_data",
                f"{name} x{xs} w{ws}",
                "compute",
                flops,
                4.0 * (x.size + w.size + y.size),
                run_b,
                check_b,
                flops_of={"v7_winograd": wino[1]["bwd_data"]},
            )
        )
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("conv"))
