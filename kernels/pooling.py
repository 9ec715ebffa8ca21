"""Max and average pooling, forward and backward (Caffe's semantics, exactly).

Contract (docs/ARCHITECTURE.md, "Kernels"):

    max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask)   x (N,C,H,W) -> y, mask (N,C,PH,PW)
    max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx)  dx (N,C,H,W) OVERWRITTEN
    ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y)
    ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx)        dx OVERWRITTEN

PH, PW are read from y's (dy's) shape: Caffe's ceil rounding is the layer's job.  Window
(p, q) covers rows [p*sh - ph, p*sh - ph + kh) and columns likewise, clipped to the image.
The window bounds along one axis are ``pool_window`` (and their inverse, the windows that cover
one input index, ``windows_covering``): one source each, compiled with njit here and with
cuda.jit(device=True) by kernels/cuda/pooling.py (STYLE 3).  max_pool_bwd takes the geometry
too, though the CPU versions need only the mask: a GPU gathers with it (one thread per input
pixel, no atomics), and the contract is one for every backend.

* max: mask (int32) = h*W + w of the maximum inside its (n, c) plane; ties go to the first
  element in row-major scan order (Caffe compares with a strict ``>``).
* average: the divisor is the window clipped to [-ph, H + ph) x [-pw, W + pw) -- that is,
  padding cells inside the padded image count, cells beyond it do not -- while the sum runs
  over the window clipped to the image (Caffe's AVE pooling; not "count_include_pad" either
  way).  The backward pass spreads dy / divisor over the same image-clipped window.
* a window with no cell inside the image (Caffe's ceil rounding makes one when stride >
  kernel, e.g. H=2, k=1, s=2, p=0) gives y = 0 (max: mask = -1) and no gradient; Caffe
  would write -FLT_MAX (max) or 0/0 (average).

Versions:
  v1_naive   Caffe's CPU loop transliterated: every window's bounds recomputed for every
             (n, c), 4-d indexing throughout.
  v2_plane   the window bounds and divisors are tabulated once per call (they do not depend
             on n or c), and each (n, c) plane is walked with contiguous rows; max pooling
             indexes flat views with unsigned offsets and keeps its running max branch-free
             (selects, not a mispredicted branch).  Serial, nogil: the engine's default for
             the backward passes and for the windows v3 does not special-case.
  v3_k2s2    v2 plus a special case for the commonest geometry (2x2, stride 2, no padding:
             LeNet's pools) with the window unrolled to four loads and no inner loops.  The
             default for average pooling forward.
  v4_prange  v2 with the (n, c) planes split across cores by prange.  Opt-in: numba's default
             workqueue threading layer cannot run two parallel regions at once.
  v5_k2s2_select  v3's unrolled 2x2 window (when the windows tile the image exactly) with v2's
             selects instead of branches, over whole flat arrays: 1.1x v3 on LeNet's pool1,
             1.5x on pool2, where random data mispredicts v3's new-maximum branches.  The
             engine's default for max pooling forward (other geometries fall back to v3, v2).
"""

import numpy as np
from numba import njit, prange

from . import _versions

_U = np.uint64

__all__ = [
    "max_pool_fwd",
    "max_pool_bwd",
    "ave_pool_fwd",
    "ave_pool_bwd",
    "max_pool_fwd_reference",
    "max_pool_bwd_reference",
    "pool_window",
    "windows_covering",
    "ave_pool_fwd_reference",
    "ave_pool_bwd_reference",
    "VERSIONS",
    "DEFAULTS",
    "use",
]


# -- reference (numpy, float64) ----------------------------------------------------------------
def _windows(H, W, PH, PW, kh, kw, sh, sw, ph, pw):
    """Yield (p, q, hs, he, ws, we, divisor) for every output position (Caffe's formulas)."""
    for p in range(PH):
        hs, he, dh = pool_window(p, kh, sh, ph, H)
        for q in range(PW):
            ws, we, dw = pool_window(q, kw, sw, pw, W)
            yield p, q, hs, he, ws, we, dh * dw  # an empty window: 0 / 1 (see top)


def max_pool_fwd_reference(x, kh, kw, sh, sw, ph, pw, PH, PW):
    """(y float64, mask int32) by argmax over each window (numpy's argmax keeps the first)."""
    x = np.asarray(x, dtype=np.float64)
    N, C, H, W = x.shape
    y = np.zeros((N, C, PH, PW))
    mask = np.full((N, C, PH, PW), -1, np.int32)
    for p, q, hs, he, ws, we, _ in _windows(H, W, PH, PW, kh, kw, sh, sw, ph, pw):
        if he <= hs or we <= ws:
            continue
        win = x[:, :, hs:he, ws:we].reshape(N, C, -1)
        k = np.argmax(win, axis=2)
        y[:, :, p, q] = np.take_along_axis(win, k[..., None], axis=2)[..., 0]
        mask[:, :, p, q] = (hs + k // (we - ws)) * W + ws + k % (we - ws)
    return y, mask


def max_pool_bwd_reference(dy, mask, x_shape):
    N, C, H, W = x_shape
    dx = np.zeros((N * C, H * W))
    m = np.asarray(mask).reshape(N * C, -1)
    d = np.asarray(dy, dtype=np.float64).reshape(N * C, -1)
    rows = np.repeat(np.arange(N * C), m.shape[1]).reshape(m.shape)
    ok = (m >= 0) & (m < H * W)  # -1: a window wholly in the padding; past the plane: not an index
    np.add.at(dx, (rows[ok], m[ok]), d[ok])
    return dx.reshape(x_shape)


def ave_pool_fwd_reference(x, kh, kw, sh, sw, ph, pw, PH, PW):
    x = np.asarray(x, dtype=np.float64)
    N, C, H, W = x.shape
    y = np.zeros((N, C, PH, PW))
    for p, q, hs, he, ws, we, div in _windows(H, W, PH, PW, kh, kw, sh, sw, ph, pw):
        y[:, :, p, q] = x[:, :, hs:he, ws:we].sum(axis=(2, 3)) / div
    return y


def ave_pool_bwd_reference(dy, kh, kw, sh, sw, ph, pw, x_shape):
    dy = np.asarray(dy, dtype=np.float64)
    N, C, H, W = x_shape
    PH, PW = dy.shape[2:]
    dx = np.zeros(x_shape)
    for p, q, hs, he, ws, we, div in _windows(H, W, PH, PW, kh, kw, sh, sw, ph, pw):
        dx[:, :, hs:he, ws:we] += (dy[:, :, p, q] / div)[:, :, None, None]
    return dx


# -- the window geometry: one source, compiled for the CPU here and for the GPU in kernels/cuda ---
def pool_window(o, k, s, p, size):
    """Window ``o`` along one axis: (lo, hi, extent).  [lo, hi) is the part of the window
    [o*s - p, o*s - p + k) inside the image [0, size); ``extent`` (>= 1) is its length clipped
    to the padded image [-p, size + p) instead: the average's divisor factor (Caffe's AVE).
    An empty [lo, hi) is a window wholly in the padding (see the top).  Conditional
    expressions instead of min/max, so the same source compiles for a GPU."""
    a = o * s - p
    b = a + k if a + k < size + p else size + p
    extent = b - a if b - a > 1 else 1
    lo = a if a > 0 else 0
    hi = b if b < size else size
    return lo, hi, extent


def windows_covering(i, k, s, p, n_out):
    """[o0, o1): the windows along one axis whose span [o*s - p, o*s - p + k) holds input
    index ``i``, i.e. o*s <= i + p < o*s + k: the inverse of pool_window, for kernels that
    gather (one thread per input pixel) instead of scattering."""
    ip = i + p
    o0 = 0 if ip < k else (ip - k) // s + 1
    o1 = ip // s + 1
    return o0, (o1 if o1 < n_out else n_out)


_pool_window = njit(nogil=True, cache=True, inline="always")(pool_window)


# -- shared checks ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _check(x, y, kh, kw, sh, sw, ph, pw):
    if x.shape[0] != y.shape[0] or x.shape[1] != y.shape[1]:
        raise ValueError("pooling: x and y must agree in N and C")
    if kh < 1 or kw < 1 or sh < 1 or sw < 1 or ph < 0 or pw < 0:
        raise ValueError("pooling: kernel and stride must be >= 1, pad >= 0")


# -- v1: naive (Caffe's loop) -------------------------------------------------------------------
@njit(nogil=True, cache=True)
def max_pool_fwd_v1_naive(x, kh, kw, sh, sw, ph, pw, y, mask):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    for n in range(N):
        for c in range(C):
            for p in range(PH):
                for q in range(PW):
                    hs, he, _ = _pool_window(p, kh, sh, ph, H)
                    ws, we, _ = _pool_window(q, kw, sw, pw, W)
                    best = y.dtype.type(0)
                    idx = -1
                    for h in range(hs, he):
                        for w in range(ws, we):
                            if idx < 0 or x[n, c, h, w] > best:
                                best = x[n, c, h, w]
                                idx = h * W + w
                    y[n, c, p, q] = best
                    mask[n, c, p, q] = idx


@njit(nogil=True, cache=True)
def max_pool_bwd_v1_naive(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    dx[...] = 0
    for n in range(N):
        for c in range(C):
            for p in range(PH):
                for q in range(PW):
                    k = mask[n, c, p, q]
                    if 0 <= k < H * W:
                        dx[n, c, k // W, k % W] += dy[n, c, p, q]


@njit(nogil=True, cache=True)
def ave_pool_fwd_v1_naive(x, kh, kw, sh, sw, ph, pw, y):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    for n in range(N):
        for c in range(C):
            for p in range(PH):
                for q in range(PW):
                    hs, he, eh = _pool_window(p, kh, sh, ph, H)
                    ws, we, ew = _pool_window(q, kw, sw, pw, W)
                    div = eh * ew
                    s = y.dtype.type(0)
                    for h in range(hs, he):
                        for w in range(ws, we):
                            s += x[n, c, h, w]
                    y[n, c, p, q] = s / div


@njit(nogil=True, cache=True)
def ave_pool_bwd_v1_naive(dy, kh, kw, sh, sw, ph, pw, dx):
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    dx[...] = 0
    for n in range(N):
        for c in range(C):
            for p in range(PH):
                for q in range(PW):
                    hs, he, eh = _pool_window(p, kh, sh, ph, H)
                    ws, we, ew = _pool_window(q, kw, sw, pw, W)
                    div = eh * ew
                    g = dy[n, c, p, q] / div
                    for h in range(hs, he):
                        for w in range(ws, we):
                            dx[n, c, h, w] += g


# -- v2: tabulated windows, one plane at a time ------------------------------------------------
@njit(nogil=True, cache=True)
def _table(n_out, size, k, s, p):
    """Per output index: [start, end) clipped to the image, and the padded extent (for the
    average's divisor).  One row per output position along one axis."""
    t = np.empty((n_out, 3), np.int64)
    for o in range(n_out):
        t[o, 0], t[o, 1], t[o, 2] = _pool_window(o, k, s, p, size)
    return t


@njit(nogil=True, cache=True, inline="always")
def _max_plane(xf, xb, W, th, tw, yf, mf, yb):
    """One (n, c) plane: xf, yf, mf are flat views of the whole arrays, xb and yb the plane's
    offsets.  Unsigned offsets (no negative-index fix-ups) and a branch-free running max:
    with random data the new-maximum branch is mispredicted about twice per window, and at
    ~15 cycles each that cost more than the loads (2x on CIFAR's 3x3 pool)."""
    o = _U(yb)
    for p in range(th.shape[0]):
        hs, he = th[p, 0], th[p, 1]
        for q in range(tw.shape[0]):
            ws, we = tw[q, 0], tw[q, 1]
            if he <= hs or we <= ws:
                yf[o] = 0
                mf[o] = -1
                o += _U(1)
                continue
            idx = hs * W + ws
            best = xf[_U(xb + idx)]
            for h in range(hs, he):
                for w in range(ws, we):
                    k = h * W + w
                    v = xf[_U(xb + k)]
                    gt = v > best  # strict: ties keep the first in scan order
                    best = v if gt else best
                    idx = k if gt else idx
            yf[o] = best
            mf[o] = idx
            o += _U(1)


@njit(nogil=True, cache=True, inline="always")
def _max_bwd_plane(dyp, mp, dxf):
    """dxf: the flat (H*W,) gradient plane.  An index outside [0, H*W) adds nothing: -1 marks a
    window wholly in the padding, and a mask that is not the forward's (scratch memory read by
    mistake) must not write outside the plane."""
    dxf[:] = 0
    for p in range(mp.shape[0]):
        for q in range(mp.shape[1]):
            k = mp[p, q]
            if 0 <= k < dxf.shape[0]:
                dxf[k] += dyp[p, q]


@njit(nogil=True, cache=True, inline="always")
def _ave_plane(xp, th, tw, yp):
    for p in range(th.shape[0]):
        hs, he = th[p, 0], th[p, 1]
        for q in range(tw.shape[0]):
            ws, we = tw[q, 0], tw[q, 1]
            s = yp.dtype.type(0)
            for h in range(hs, he):
                for w in range(ws, we):
                    s += xp[h, w]
            yp[p, q] = s / (th[p, 2] * tw[q, 2])


@njit(nogil=True, cache=True, inline="always")
def _ave_bwd_plane(dyp, th, tw, dxp):
    dxp[...] = 0
    for p in range(th.shape[0]):
        hs, he = th[p, 0], th[p, 1]
        for q in range(tw.shape[0]):
            ws, we = tw[q, 0], tw[q, 1]
            g = dyp[p, q] / (th[p, 2] * tw[q, 2])
            for h in range(hs, he):
                for w in range(ws, we):
                    dxp[h, w] += g


@njit(nogil=True, cache=True)
def max_pool_fwd_v2_plane(x, kh, kw, sh, sw, ph, pw, y, mask):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    th = _table(y.shape[2], H, kh, sh, ph)
    tw = _table(y.shape[3], W, kw, sw, pw)
    xf, yf, mf = x.reshape(x.size), y.reshape(y.size), mask.reshape(mask.size)
    P = y.shape[2] * y.shape[3]
    for k in range(N * C):
        _max_plane(xf, k * H * W, W, th, tw, yf, mf, k * P)


@njit(nogil=True, cache=True)
def max_pool_bwd_v2_plane(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    N, C, H, W = dx.shape
    dxf = dx.reshape(N, C, H * W)
    for n in range(N):
        for c in range(C):
            _max_bwd_plane(dy[n, c], mask[n, c], dxf[n, c])


@njit(nogil=True, cache=True)
def ave_pool_fwd_v2_plane(x, kh, kw, sh, sw, ph, pw, y):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    th = _table(y.shape[2], H, kh, sh, ph)
    tw = _table(y.shape[3], W, kw, sw, pw)
    for n in range(N):
        for c in range(C):
            _ave_plane(x[n, c], th, tw, y[n, c])


@njit(nogil=True, cache=True)
def ave_pool_bwd_v2_plane(dy, kh, kw, sh, sw, ph, pw, dx):
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    N, C, H, W = dx.shape
    th = _table(dy.shape[2], H, kh, sh, ph)
    tw = _table(dy.shape[3], W, kw, sw, pw)
    for n in range(N):
        for c in range(C):
            _ave_bwd_plane(dy[n, c], th, tw, dx[n, c])


# -- v3: 2x2 stride-2 special case --------------------------------------------------------------
@njit(nogil=True, cache=True)
def max_pool_fwd_v3_k2s2(x, kh, kw, sh, sw, ph, pw, y, mask):
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    if not (kh == 2 and kw == 2 and sh == 2 and sw == 2 and ph == 0 and pw == 0 and 2 * PH <= H and 2 * PW <= W):
        max_pool_fwd_v2_plane(x, kh, kw, sh, sw, ph, pw, y, mask)
        return
    _check(x, y, kh, kw, sh, sw, ph, pw)
    for n in range(N):
        for c in range(C):
            xp = x[n, c]
            yp = y[n, c]
            mp = mask[n, c]
            for p in range(PH):
                r0 = xp[2 * p]
                r1 = xp[2 * p + 1]
                b0 = 2 * p * W
                b1 = b0 + W
                for q in range(PW):
                    w = 2 * q
                    best = r0[w]
                    idx = b0 + w
                    if r0[w + 1] > best:
                        best = r0[w + 1]
                        idx = b0 + w + 1
                    if r1[w] > best:
                        best = r1[w]
                        idx = b1 + w
                    if r1[w + 1] > best:
                        best = r1[w + 1]
                        idx = b1 + w + 1
                    yp[p, q] = best
                    mp[p, q] = idx


@njit(nogil=True, cache=True)
def ave_pool_fwd_v3_k2s2(x, kh, kw, sh, sw, ph, pw, y):
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    if not (kh == 2 and kw == 2 and sh == 2 and sw == 2 and ph == 0 and pw == 0 and 2 * PH <= H and 2 * PW <= W):
        ave_pool_fwd_v2_plane(x, kh, kw, sh, sw, ph, pw, y)
        return
    _check(x, y, kh, kw, sh, sw, ph, pw)
    quarter = y.dtype.type(0.25)
    for n in range(N):
        for c in range(C):
            xp = x[n, c]
            yp = y[n, c]
            for p in range(PH):
                r0 = xp[2 * p]
                r1 = xp[2 * p + 1]
                for q in range(PW):
                    w = 2 * q
                    yp[p, q] = ((r0[w] + r0[w + 1]) + (r1[w] + r1[w + 1])) * quarter


# -- v5: 2x2 stride-2, branch-free --------------------------------------------------------------
@njit(nogil=True, cache=True, inline="always")
def _k2s2(kh, kw, sh, sw, ph, pw, H, W, PH, PW):
    """Is the geometry 2x2, stride 2, no padding, windows tiling the image exactly?"""
    return kh == 2 and kw == 2 and sh == 2 and sw == 2 and ph == 0 and pw == 0 and 2 * PH == H and 2 * PW == W


@njit(nogil=True, cache=True)
def max_pool_fwd_v5_k2s2_select(x, kh, kw, sh, sw, ph, pw, y, mask):
    """v3's unrolled 2x2 window with v2's selects instead of branches: the four values are
    compared in scan order (strict >: ties keep the first) and the winner's offset (0, 1, W,
    W+1 from the window's corner) is picked by selects, so random data costs no mispredicted
    branch.  Whole flat arrays, unsigned offsets; other geometries: v3 (which falls back to v2)."""
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    if not _k2s2(kh, kw, sh, sw, ph, pw, H, W, PH, PW):
        max_pool_fwd_v3_k2s2(x, kh, kw, sh, sw, ph, pw, y, mask)
        return
    _check(x, y, kh, kw, sh, sw, ph, pw)
    xf, yf, mf = x.reshape(x.size), y.reshape(y.size), mask.reshape(mask.size)
    for r in range(N * C * PH):  # output row r: input rows 2r and 2r + 1 of the flat (N*C*H, W)
        x0 = _U(2 * r * W)
        x1 = x0 + _U(W)
        o = _U(r * PW)
        corner = (2 * r % H) * W  # the window row's first index inside its (n, c) plane
        for q in range(PW):
            w = _U(2 * q)
            best, off = xf[x0 + w], 0
            v = xf[x0 + w + _U(1)]
            gt = v > best
            best, off = (v, 1) if gt else (best, off)
            v = xf[x1 + w]
            gt = v > best
            best, off = (v, W) if gt else (best, off)
            v = xf[x1 + w + _U(1)]
            gt = v > best
            best, off = (v, W + 1) if gt else (best, off)
            yf[o + _U(q)] = best
            mf[o + _U(q)] = corner + 2 * q + off


# -- v4: prange over planes -----------------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True)
def max_pool_fwd_v4_prange(x, kh, kw, sh, sw, ph, pw, y, mask):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    th = _table(y.shape[2], H, kh, sh, ph)
    tw = _table(y.shape[3], W, kw, sw, pw)
    xf, yf, mf = x.reshape(x.size), y.reshape(y.size), mask.reshape(mask.size)
    P = y.shape[2] * y.shape[3]
    for k in prange(N * C):
        _max_plane(xf, k * H * W, W, th, tw, yf, mf, k * P)


@njit(nogil=True, cache=True, parallel=True)
def max_pool_bwd_v4_prange(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    N, C, H, W = dx.shape
    dxf = dx.reshape(N, C, H * W)
    for k in prange(N * C):
        n, c = k // C, k % C
        _max_bwd_plane(dy[n, c], mask[n, c], dxf[n, c])


@njit(nogil=True, cache=True, parallel=True)
def ave_pool_fwd_v4_prange(x, kh, kw, sh, sw, ph, pw, y):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    N, C, H, W = x.shape
    th = _table(y.shape[2], H, kh, sh, ph)
    tw = _table(y.shape[3], W, kw, sw, pw)
    for k in prange(N * C):
        n, c = k // C, k % C
        _ave_plane(x[n, c], th, tw, y[n, c])


@njit(nogil=True, cache=True, parallel=True)
def ave_pool_bwd_v4_prange(dy, kh, kw, sh, sw, ph, pw, dx):
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    N, C, H, W = dx.shape
    th = _table(dy.shape[2], H, kh, sh, ph)
    tw = _table(dy.shape[3], W, kw, sw, pw)
    for k in prange(N * C):
        n, c = k // C, k % C
        _ave_bwd_plane(dy[n, c], th, tw, dx[n, c])


VERSIONS = {
    "max_pool_fwd": {
        "v1_naive": max_pool_fwd_v1_naive,
        "v2_plane": max_pool_fwd_v2_plane,
        "v3_k2s2": max_pool_fwd_v3_k2s2,
        "v4_prange": max_pool_fwd_v4_prange,
        "v5_k2s2_select": max_pool_fwd_v5_k2s2_select,
    },
    "max_pool_bwd": {
        "v1_naive": max_pool_bwd_v1_naive,
        "v2_plane": max_pool_bwd_v2_plane,
        "v4_prange": max_pool_bwd_v4_prange,
    },
    "ave_pool_fwd": {
        "v1_naive": ave_pool_fwd_v1_naive,
        "v2_plane": ave_pool_fwd_v2_plane,
        "v3_k2s2": ave_pool_fwd_v3_k2s2,
        "v4_prange": ave_pool_fwd_v4_prange,
    },
    "ave_pool_bwd": {
        "v1_naive": ave_pool_bwd_v1_naive,
        "v2_plane": ave_pool_bwd_v2_plane,
        "v4_prange": ave_pool_bwd_v4_prange,
    },
}
DEFAULTS = {
    "max_pool_fwd": "v5_k2s2_select",
    "max_pool_bwd": "v2_plane",
    "ave_pool_fwd": "v3_k2s2",
    "ave_pool_bwd": "v2_plane",
}
REFERENCES = {
    "max_pool_fwd": max_pool_fwd_reference,
    "max_pool_bwd": max_pool_bwd_reference,
    "ave_pool_fwd": ave_pool_fwd_reference,
    "ave_pool_bwd": ave_pool_bwd_reference,
}

max_pool_fwd = VERSIONS["max_pool_fwd"][DEFAULTS["max_pool_fwd"]]
max_pool_bwd = VERSIONS["max_pool_bwd"][DEFAULTS["max_pool_bwd"]]
ave_pool_fwd = VERSIONS["ave_pool_fwd"][DEFAULTS["ave_pool_fwd"]]
ave_pool_bwd = VERSIONS["ave_pool_bwd"][DEFAULTS["ave_pool_bwd"]]


def use(version):
    """Bind the four pooling kernels to ``version`` where they have it (v3_k2s2 exists for the
    forward passes only: the backward passes keep what they had), or "default"."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("pooling")


# -- self-check and benchmark: python -m kernels.pooling --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.pooling``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import pooling as PO

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(3)
    shapes = [
        ("LeNet pool1 MAX", (64, 20, 24, 24), 2, 2, "max"),
        ("LeNet pool2 MAX", (64, 50, 8, 8), 2, 2, "max"),
        ("CIFAR pool1 MAX", (100, 32, 32, 32), 3, 2, "max"),
        ("CIFAR pool2 AVE", (100, 32, 16, 16), 3, 2, "ave"),
    ]
    if quick:
        shapes = [shapes[0], shapes[2], shapes[3]]
    cases = []
    for name, xs, k, s, kind in shapes:
        x = rng.standard_normal(xs).astype(F32)
        P = -(-(xs[2] - k) // s) + 1
        ys = xs[:2] + (P, P)
        y = np.empty(ys, F32)
        mask = np.empty(ys, np.int32)
        dy = rng.standard_normal(ys).astype(F32)
        dx = np.empty(xs, F32)
        if kind == "max":
            y_ref, m_ref = PO.max_pool_fwd_reference(x, k, k, s, s, 0, 0, P, P)
            dx_ref = PO.max_pool_bwd_reference(dy, m_ref, xs)

            def run_f(fn, x=x, y=y, mask=mask, k=k, s=s):
                return lambda: fn(x, k, k, s, s, 0, 0, y, mask)

            def run_b(fn, dy=dy, m=m_ref, dx=dx, k=k, s=s):
                return lambda: fn(dy, m, k, k, s, s, 0, 0, dx)

            def check_f(fn, y=y, mask=mask, y_ref=y_ref, m_ref=m_ref):
                close(y, y_ref, 0.0, "max_pool_fwd")
                close(mask, m_ref, 0.0, "max_pool_fwd mask")

            def check_b(fn, dx=dx, dx_ref=dx_ref, k=k, dy=dy, m=m_ref):
                close(dx, dx_ref, sum_tol(k * k, PO.max_pool_bwd_reference(np.abs(dy), m, dx.shape)), "max_pool_bwd")

            fwd_bytes = 4.0 * (x.size + 2 * y.size)
            bwd_bytes = 4.0 * (2 * dy.size + dx.size)
            fns = ("max_pool_fwd", "max_pool_bwd")
        else:
            y_ref = PO.ave_pool_fwd_reference(x, k, k, s, s, 0, 0, P, P)
            dx_ref = PO.ave_pool_bwd_reference(dy, k, k, s, s, 0, 0, xs)

            def run_f(fn, x=x, y=y, k=k, s=s):
                return lambda: fn(x, k, k, s, s, 0, 0, y)

            def run_b(fn, dy=dy, dx=dx, k=k, s=s):
                return lambda: fn(dy, k, k, s, s, 0, 0, dx)

            def check_f(fn, y=y, y_ref=y_ref, k=k, x=x, P=P, s=s):
                close(
                    y,
                    y_ref,
                    sum_tol(k * k, PO.ave_pool_fwd_reference(np.abs(x), k, k, s, s, 0, 0, P, P)),
                    "ave_pool_fwd",
                )

            def check_b(fn, dx=dx, dx_ref=dx_ref, k=k, dy=dy, s=s):
                close(
                    dx,
                    dx_ref,
                    sum_tol(k * k, PO.ave_pool_bwd_reference(np.abs(dy), k, k, s, s, 0, 0, dx.shape)),
                    "ave_pool_bwd",
                )

            fwd_bytes = 4.0 * (x.size + y.size)
            bwd_bytes = 4.0 * (dy.size + dx.size)
            fns = ("ave_pool_fwd", "ave_pool_bwd")
        cases.append(Case("pooling", fns[0], f"{name} x{xs} k{k}s{s}", "memory", 0, fwd_bytes, run_f, check_f))
        cases.append(Case("pooling", fns[1], f"{name} x{xs} k{k}s{s}", "memory", 0, bwd_bytes, run_b, check_b))
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("pooling"))
