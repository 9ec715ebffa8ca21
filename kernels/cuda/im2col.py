"""im2col / col2im on the GPU (the batched layout of ``kernels/im2col.py``).

Contract: the CPU family's::

    im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, col)   x (N, C, H, W) -> col (C*kh*kw, N*OH*OW)
    col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, x)   x OVERWRITTEN with the sum of the patches
    col[(c*kh + i)*kw + j, n*OH*OW + oh*OW + ow] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]

Each wrapper takes the launcher ``L`` first; shapes are checked on the host (a wrong col shape is
a ValueError, not an out-of-bounds write).  Checked against the CPU file's float64 references.

Versions:
  v1_naive   im2col: one thread per element of col (r, q), q fastest: a warp writes 32
             consecutive columns of one row (coalesced) and reads x along a row of the image.
             col2im: the same mapping, each thread atomically adding its value into x (x is
             zeroed first); overlapping patches collide on the same address, and float atomics
             make the summation order, so the last bits, run-dependent.
  v2_caffe   Caffe's kernels.  im2col: one thread per (c, q) -- a channel and an output pixel --
             writing all kh*kw entries of its column: the index arithmetic (divisions) is done
             once per column instead of once per element.  col2im: one thread per *input* pixel
             (n, c, h, w), gathering from the (at most ceil(kh/sh) x ceil(kw/sw)) columns whose
             patch covers it: no atomics, deterministic, and x is written exactly once.  The
             default.
"""

from numba import cuda

from .. import _versions
from ..im2col import REFERENCES, col_pixel  # noqa: F401  (REFERENCES: what the tests check against)
from ._grid import unravel_nchw

#: the CPU naive versions' index map, compiled for the GPU (one source: kernels/im2col.py)
_col_pixel_dev = cuda.jit(device=True)(col_pixel)

__all__ = ["im2col", "col2im", "VERSIONS", "DEFAULTS", "use"]


def _geometry(x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    if x.ndim != 4 or col.ndim != 2:
        raise ValueError(f"im2col/col2im: x must be 4-d and col 2-d, got {tuple(x.shape)}, {tuple(col.shape)}")
    if kh < 1 or kw < 1 or sh < 1 or sw < 1 or dh < 1 or dw < 1 or ph < 0 or pw < 0:
        raise ValueError("im2col/col2im: kernel, stride, dilation must be >= 1, pad >= 0")
    N, C, H, W = x.shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    if OH < 1 or OW < 1:
        raise ValueError("im2col/col2im: the (dilated) kernel is larger than the padded input")
    if tuple(col.shape) != (C * kh * kw, N * OH * OW):
        raise ValueError(
            f"im2col/col2im: col must have shape (C*kh*kw, N*OH*OW) = "
            f"{(C * kh * kw, N * OH * OW)}, got {tuple(col.shape)}"
        )
    return N, C, H, W, OH, OW


# -- v1 ---------------------------------------------------------------------------------------------
@cuda.jit
def _im2col_v1(x, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, col):
    """Thread t (grid-stride) -> col element (r, q) = divmod(t, P), P = N*OH*OW."""
    N, C, H, W = x.shape
    P = col.shape[1]
    zero = col.dtype.type(0)
    t = cuda.grid(1)
    while t < col.shape[0] * P:
        r = t // P
        q = t - r * P
        n, c, ih, iw = _col_pixel_dev(r, q, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
        if 0 <= ih < H and 0 <= iw < W:
            col[r, q] = x[n, c, ih, iw]
        else:
            col[r, q] = zero
        t += cuda.gridsize(1)


@cuda.jit
def _col2im_v1(col, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, x):
    """Thread t (grid-stride) -> col element (r, q); atomic add into its pixel of x."""
    N, C, H, W = x.shape
    P = col.shape[1]
    t = cuda.grid(1)
    while t < col.shape[0] * P:
        r = t // P
        q = t - r * P
        n, c, ih, iw = _col_pixel_dev(r, q, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW)
        if 0 <= ih < H and 0 <= iw < W:
            cuda.atomic.add(x, (n, c, ih, iw), col[r, q])
        t += cuda.gridsize(1)


# -- v2: Caffe's ------------------------------------------------------------------------------------
@cuda.jit
def _im2col_v2(x, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, col):
    """Thread t (grid-stride) -> (c, q) = divmod(t, P): one output pixel of one channel; it
    writes col[(c*kh + i)*kw + j, q] for every tap (i, j).  Consecutive threads, consecutive q:
    every store of the warp is coalesced."""
    N, C, H, W = x.shape
    P = col.shape[1]
    zero = col.dtype.type(0)
    t = cuda.grid(1)
    while t < C * P:
        c = t // P
        q = t - c * P
        n = q // (OH * OW)
        oh = (q // OW) % OH
        ow = q % OW
        h0 = oh * sh - ph
        w0 = ow * sw - pw
        r = c * kh * kw
        for i in range(kh):
            ih = h0 + i * dh
            for j in range(kw):
                iw = w0 + j * dw
                if 0 <= ih < H and 0 <= iw < W:
                    col[r, q] = x[n, c, ih, iw]
                else:
                    col[r, q] = zero
                r += 1
        t += cuda.gridsize(1)


@cuda.jit
def _col2im_v2(col, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, x):
    """Thread t (grid-stride) -> input pixel (n, c, h, w) in x's order (coalesced stores).  Tap
    (i, j) of output pixel (oh, ow) covers it when h + ph - i*dh = oh*sh with 0 <= oh < OH (and
    the same along w); the thread sums those col entries and writes x once."""
    N, C, H, W = x.shape
    t = cuda.grid(1)
    while t < x.size:
        n, c, h, w = unravel_nchw(t, C, H, W)
        acc = x.dtype.type(0)
        for i in range(kh):
            hh = h + ph - i * dh
            if hh >= 0 and hh % sh == 0 and hh // sh < OH:
                oh = hh // sh
                for j in range(kw):
                    ww = w + pw - j * dw
                    if ww >= 0 and ww % sw == 0 and ww // sw < OW:
                        acc += col[(c * kh + i) * kw + j, n * OH * OW + oh * OW + ww // sw]
        x[n, c, h, w] = acc
        t += cuda.gridsize(1)


# -- wrappers ---------------------------------------------------------------------------------------
def im2col_v1_naive(L, x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _geometry(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    if col.size:
        L.launch1d(_im2col_v1, col.size, x, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, col)


def col2im_v1_naive(L, col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _geometry(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    x.fill(0)  # on the GPU: a CuPy kernel on the same stream
    if col.size:
        L.launch1d(_col2im_v1, col.size, col, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, x)


def im2col_v2_caffe(L, x, kh, kw, ph, pw, sh, sw, dh, dw, col):
    N, C, H, W, OH, OW = _geometry(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    if col.size:
        L.launch1d(_im2col_v2, C * col.shape[1], x, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, col)


def col2im_v2_caffe(L, col, kh, kw, ph, pw, sh, sw, dh, dw, x):
    N, C, H, W, OH, OW = _geometry(x, kh, kw, ph, pw, sh, sw, dh, dw, col)
    if x.size:
        L.launch1d(_col2im_v2, x.size, col, kh, kw, ph, pw, sh, sw, dh, dw, OH, OW, x)


VERSIONS = {
    "im2col": {"v1_naive": im2col_v1_naive, "v2_caffe": im2col_v2_caffe},
    "col2im": {"v1_naive": col2im_v1_naive, "v2_caffe": col2im_v2_caffe},
}
DEFAULTS = {"im2col": "v2_caffe", "col2im": "v2_caffe"}

im2col = VERSIONS["im2col"][DEFAULTS["im2col"]]
col2im = VERSIONS["col2im"][DEFAULTS["col2im"]]


def use(version):
    """Bind im2col and col2im to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.im2col: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "im2col"] + sys.argv[1:]))
