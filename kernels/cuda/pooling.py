"""Max and average pooling on the GPU, forward and backward (Caffe's semantics exactly).

Contract: the CPU family's (``kernels/pooling.py``)::

    max_pool_fwd(x, kh, kw, sh, sw, ph, pw, y, mask)    mask int32 = h*W + w of the max
    max_pool_bwd(dy, mask, kh, kw, sh, sw, ph, pw, dx)  dx OVERWRITTEN
    ave_pool_fwd(x, kh, kw, sh, sw, ph, pw, y)          divisor: window clipped to H+ph, W+pw
    ave_pool_bwd(dy, kh, kw, sh, sw, ph, pw, dx)        dx OVERWRITTEN

Ties go to the first element in row-major order (strict ``>``); a window wholly in the padding
gives y = 0, mask = -1.  Each wrapper takes the launcher ``L`` first.  Checked against the CPU
file's float64 references.  The window bounds (``pool_window``) and their inverse
(``windows_covering``) are the CPU file's functions compiled as device functions: one source.

Versions:
  v1_scatter  one thread per OUTPUT (n, c, p, q), in y's order (coalesced stores of y and mask).
              Forward: the thread scans its window.  Backward: the thread adds its dy into the
              input pixels it came from with atomics (dx zeroed first); overlapping windows
              (stride < kernel) collide there, and float atomics make the order of the sum, so
              its last bits, change from run to run.
  v2_gather   backward only: one thread per INPUT pixel (n, c, h, w), summing over the windows
              [(h + ph - kh)/sh + 1, (h + ph)/sh] that cover it (Caffe's MaxPoolBackward and
              AvePoolBackward): average adds dy / divisor, max adds dy where the window's mask
              names this pixel.  No atomics, every dx written once, deterministic, and the sum
              runs in the CPU versions' order (bit-identical to them).  The default backward.
"""

from numba import cuda

from .. import _versions
from ..pooling import REFERENCES, pool_window, windows_covering  # noqa: F401  (REFERENCES: for the tests)
from ._grid import unravel_nchw

_window = cuda.jit(device=True)(pool_window)
_covering = cuda.jit(device=True)(windows_covering)

__all__ = ["max_pool_fwd", "max_pool_bwd", "ave_pool_fwd", "ave_pool_bwd", "VERSIONS", "DEFAULTS", "use"]


def _check(x, y, kh, kw, sh, sw, ph, pw):
    if x.ndim != 4 or y.ndim != 4 or x.shape[0] != y.shape[0] or x.shape[1] != y.shape[1]:
        raise ValueError(f"pooling: x {tuple(x.shape)} and y {tuple(y.shape)} must be 4-d and agree in N and C")
    if kh < 1 or kw < 1 or sh < 1 or sw < 1 or ph < 0 or pw < 0:
        raise ValueError("pooling: kernel and stride must be >= 1, pad >= 0")


@cuda.jit
def _max_fwd(x, kh, kw, sh, sw, ph, pw, y, mask):
    """Thread t (grid-stride) -> output (n, c, p, q) in y's flat order."""
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    t = cuda.grid(1)
    while t < y.size:
        n, c, p, q = unravel_nchw(t, C, PH, PW)
        hs, he, _ = _window(p, kh, sh, ph, H)
        ws, we, _ = _window(q, kw, sw, pw, W)
        best = y.dtype.type(0)
        idx = -1
        for h in range(hs, he):
            for w in range(ws, we):
                if idx < 0 or x[n, c, h, w] > best:
                    best = x[n, c, h, w]
                    idx = h * W + w
        y[n, c, p, q] = best
        mask[n, c, p, q] = idx
        t += cuda.gridsize(1)


@cuda.jit
def _max_bwd_scatter(dy, mask, dx):
    """Thread t (grid-stride) -> output (n, c, p, q); atomic add of dy into dx at the mask."""
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    t = cuda.grid(1)
    while t < dy.size:
        n, c, p, q = unravel_nchw(t, C, PH, PW)
        k = mask[n, c, p, q]
        if 0 <= k < H * W:  # -1: a window in the padding; never write outside the plane
            cuda.atomic.add(dx, (n, c, k // W, k % W), dy[n, c, p, q])
        t += cuda.gridsize(1)


@cuda.jit
def _max_bwd_gather(dy, mask, kh, kw, sh, sw, ph, pw, dx):
    """Thread t (grid-stride) -> input pixel (n, c, h, w) in dx's order: the sum of dy over the
    windows covering it whose maximum it was (mask == h*W + w), in (p, q) order."""
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    t = cuda.grid(1)
    while t < dx.size:
        n, c, h, w = unravel_nchw(t, C, H, W)
        p0, p1 = _covering(h, kh, sh, ph, PH)
        q0, q1 = _covering(w, kw, sw, pw, PW)
        k = h * W + w
        acc = dx.dtype.type(0)
        for p in range(p0, p1):
            for q in range(q0, q1):
                if mask[n, c, p, q] == k:
                    acc += dy[n, c, p, q]
        dx[n, c, h, w] = acc
        t += cuda.gridsize(1)


@cuda.jit
def _ave_fwd(x, kh, kw, sh, sw, ph, pw, y):
    """Thread t (grid-stride) -> output (n, c, p, q) in y's flat order."""
    N, C, H, W = x.shape
    PH, PW = y.shape[2], y.shape[3]
    t = cuda.grid(1)
    while t < y.size:
        n, c, p, q = unravel_nchw(t, C, PH, PW)
        hs, he, eh = _window(p, kh, sh, ph, H)
        ws, we, ew = _window(q, kw, sw, pw, W)
        s = y.dtype.type(0)
        for h in range(hs, he):
            for w in range(ws, we):
                s += x[n, c, h, w]
        y[n, c, p, q] = s / (eh * ew)
        t += cuda.gridsize(1)


@cuda.jit
def _ave_bwd_scatter(dy, kh, kw, sh, sw, ph, pw, dx):
    """Thread t (grid-stride) -> output (n, c, p, q); atomic adds of dy/divisor into its window."""
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    t = cuda.grid(1)
    while t < dy.size:
        n, c, p, q = unravel_nchw(t, C, PH, PW)
        hs, he, eh = _window(p, kh, sh, ph, H)
        ws, we, ew = _window(q, kw, sw, pw, W)
        g = dy[n, c, p, q] / (eh * ew)
        for h in range(hs, he):
            for w in range(ws, we):
                cuda.atomic.add(dx, (n, c, h, w), g)
        t += cuda.gridsize(1)


@cuda.jit
def _ave_bwd_gather(dy, kh, kw, sh, sw, ph, pw, dx):
    """Thread t (grid-stride) -> input pixel (n, c, h, w) in dx's order: the sum of
    dy / divisor over the windows covering it."""
    N, C, H, W = dx.shape
    PH, PW = dy.shape[2], dy.shape[3]
    t = cuda.grid(1)
    while t < dx.size:
        n, c, h, w = unravel_nchw(t, C, H, W)
        p0, p1 = _covering(h, kh, sh, ph, PH)
        q0, q1 = _covering(w, kw, sw, pw, PW)
        acc = dx.dtype.type(0)
        for p in range(p0, p1):
            _, _, eh = _window(p, kh, sh, ph, H)
            for q in range(q0, q1):
                _, _, ew = _window(q, kw, sw, pw, W)
                acc += dy[n, c, p, q] / (eh * ew)
        dx[n, c, h, w] = acc
        t += cuda.gridsize(1)


# -- wrappers -------------------------------------------------------------------------------------
def _check_mask(dy, mask):
    if dy.ndim != 4 or tuple(mask.shape) != tuple(dy.shape):
        raise ValueError(f"max_pool_bwd: dy {tuple(dy.shape)} and mask {tuple(mask.shape)} must be equal 4-d shapes")


def max_pool_fwd_v1_scatter(L, x, kh, kw, sh, sw, ph, pw, y, mask):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    if y.size:
        L.launch1d(_max_fwd, y.size, x, kh, kw, sh, sw, ph, pw, y, mask)


def max_pool_bwd_v1_scatter(L, dy, mask, kh, kw, sh, sw, ph, pw, dx):
    _check_mask(dy, mask)
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    dx.fill(0)
    if dy.size:
        L.launch1d(_max_bwd_scatter, dy.size, dy, mask, dx)


def max_pool_bwd_v2_gather(L, dy, mask, kh, kw, sh, sw, ph, pw, dx):
    _check_mask(dy, mask)
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    if dx.size:
        L.launch1d(_max_bwd_gather, dx.size, dy, mask, kh, kw, sh, sw, ph, pw, dx)


def ave_pool_fwd_v1_scatter(L, x, kh, kw, sh, sw, ph, pw, y):
    _check(x, y, kh, kw, sh, sw, ph, pw)
    if y.size:
        L.launch1d(_ave_fwd, y.size, x, kh, kw, sh, sw, ph, pw, y)


def ave_pool_bwd_v1_scatter(L, dy, kh, kw, sh, sw, ph, pw, dx):
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    dx.fill(0)
    if dy.size:
        L.launch1d(_ave_bwd_scatter, dy.size, dy, kh, kw, sh, sw, ph, pw, dx)


def ave_pool_bwd_v2_gather(L, dy, kh, kw, sh, sw, ph, pw, dx):
    _check(dx, dy, kh, kw, sh, sw, ph, pw)
    if dx.size:
        L.launch1d(_ave_bwd_gather, dx.size, dy, kh, kw, sh, sw, ph, pw, dx)


VERSIONS = {
    "max_pool_fwd": {"v1_scatter": max_pool_fwd_v1_scatter},
    "max_pool_bwd": {"v1_scatter": max_pool_bwd_v1_scatter, "v2_gather": max_pool_bwd_v2_gather},
    "ave_pool_fwd": {"v1_scatter": ave_pool_fwd_v1_scatter},
    "ave_pool_bwd": {"v1_scatter": ave_pool_bwd_v1_scatter, "v2_gather": ave_pool_bwd_v2_gather},
}
DEFAULTS = {
    "max_pool_fwd": "v1_scatter",
    "max_pool_bwd": "v2_gather",
    "ave_pool_fwd": "v1_scatter",
    "ave_pool_bwd": "v2_gather",
}

max_pool_fwd = VERSIONS["max_pool_fwd"][DEFAULTS["max_pool_fwd"]]
max_pool_bwd = VERSIONS["max_pool_bwd"][DEFAULTS["max_pool_bwd"]]
ave_pool_fwd = VERSIONS["ave_pool_fwd"][DEFAULTS["ave_pool_fwd"]]
ave_pool_bwd = VERSIONS["ave_pool_bwd"][DEFAULTS["ave_pool_bwd"]]


def use(version):
    """Bind the pooling kernels that have ``version`` to it (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.pooling: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "pooling"] + sys.argv[1:]))
