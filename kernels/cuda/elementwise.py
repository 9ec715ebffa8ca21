"""Elementwise activations on the GPU: ReLU (leaky), sigmoid, tanh, forward and backward.

Contract: the CPU family's (``kernels/elementwise.py``): flat 1-d arrays of one length, float32
or float64, in place allowed (y is x, dx is dy).  Each wrapper takes the launcher ``L`` first
(``kernels/cuda/_launch.py``); the backend binds it.  Checked against the CPU file's float64
references.

These are pure streams: 8-12 bytes moved per element for a couple of flops, so the only figure
that matters is GB/s against the device's copy bandwidth (the benchmark prints both).

Versions:
  v1_naive       one thread per element: ``i = cuda.grid(1); if i < n``; a grid of
                 ceil(n / 256) blocks.  Constants are Python floats, so float32 math is widened
                 to float64 (on most GPUs FP64 runs at 1/32 to 1/2 the FP32 rate).
  v2_gridstride  thread i handles i, i + G, i + 2G, ... (G = threads in the grid), with a grid
                 capped at a few waves of blocks, and constants of the array's own dtype.
                 Consecutive threads touch consecutive elements on every pass, so each warp's
                 loads and stores coalesce into full 128-byte transactions.  The default.
"""

import math

from numba import cuda

from .. import _versions
from ..elementwise import REFERENCES  # noqa: F401  (the float64 references the tests check against)

__all__ = ["relu_fwd", "relu_bwd", "sigmoid_fwd", "sigmoid_bwd", "tanh_fwd", "tanh_bwd", "VERSIONS", "DEFAULTS", "use"]


# -- v1: one thread per element -------------------------------------------------------------------
@cuda.jit
def _relu_fwd_v1(x, slope, y):
    i = cuda.grid(1)
    if i < x.size:
        if x[i] > 0:
            y[i] = x[i]
        else:
            y[i] = slope * x[i]


@cuda.jit
def _relu_bwd_v1(x, dy, slope, dx):
    i = cuda.grid(1)
    if i < x.size:
        dx[i] = dy[i] * ((1.0 if x[i] > 0 else 0.0) + slope * (1.0 if x[i] <= 0 else 0.0))


@cuda.jit
def _sigmoid_fwd_v1(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 1.0 / (1.0 + math.exp(-x[i]))


@cuda.jit
def _sigmoid_bwd_v1(y, dy, dx):
    i = cuda.grid(1)
    if i < y.size:
        dx[i] = dy[i] * y[i] * (1.0 - y[i])


@cuda.jit
def _tanh_fwd_v1(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = math.tanh(x[i])


@cuda.jit
def _tanh_bwd_v1(y, dy, dx):
    i = cuda.grid(1)
    if i < y.size:
        dx[i] = dy[i] * (1.0 - y[i] * y[i])


def _full_grid(L, kernel, n, *args):
    """v1's launch: one thread per element, ceil(n / threads) blocks, uncapped."""
    t = L.config.threads
    L.launch(kernel, max(1, math.ceil(n / t)), t, *args)


# -- v2: grid-stride, typed ------------------------------------------------------------------------
@cuda.jit
def _relu_fwd_v2(x, slope, y):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        v = x[i]
        y[i] = v if v > 0 else slope * v
        i += step


@cuda.jit
def _relu_bwd_v2(x, dy, slope, dx):
    one = dx.dtype.type(1)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        dx[i] = dy[i] * (one if x[i] > 0 else slope)
        i += step


@cuda.jit
def _sigmoid_fwd_v2(x, y):
    """exp of a non-positive number only: e = exp(-|x|) in (0, 1], y = 1/(1+e) or e/(1+e).
    (v1's exp(-x) overflows for x < -88 in float32: inf on a GPU, which still gives the right
    0, but an OverflowError in the simulator, whose math is Python's.)"""
    one = y.dtype.type(1)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        v = x[i]
        e = math.exp(-v if v >= 0 else v)
        y[i] = one / (one + e) if v >= 0 else e / (one + e)
        i += step


@cuda.jit
def _sigmoid_bwd_v2(y, dy, dx):
    one = dx.dtype.type(1)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < y.size:
        v = y[i]
        dx[i] = dy[i] * v * (one - v)
        i += step


@cuda.jit
def _tanh_fwd_v2(x, y):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        y[i] = math.tanh(x[i])
        i += step


@cuda.jit
def _tanh_bwd_v2(y, dy, dx):
    one = dx.dtype.type(1)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < y.size:
        v = y[i]
        dx[i] = dy[i] * (one - v * v)
        i += step


# -- wrappers: (L, flat contract) -------------------------------------------------------------------
def _check(*arrays):
    n = arrays[0].size
    for a in arrays:
        if a.ndim != 1 or a.size != n:
            raise ValueError(
                f"elementwise: all arrays must be 1-d of one length, got shapes {[tuple(b.shape) for b in arrays]}"
            )
    return n


def _make(name, kernel, grid):
    """The wrapper ``name(L, ...)`` with the CPU contract's arguments (``grid`` launches it); ReLU's
    slope goes in as a scalar of the arrays' dtype."""
    if name == "relu_fwd":

        def run(L, x, slope, y):
            if _check(x, y):
                grid(L, kernel, x.size, x, L.scalar(slope, y.dtype), y)
    elif name == "relu_bwd":

        def run(L, x, dy, slope, dx):
            if _check(x, dy, dx):
                grid(L, kernel, x.size, x, dy, L.scalar(slope, dx.dtype), dx)
    else:

        def run(L, a, b, c=None):
            arrays = (a, b) if c is None else (a, b, c)
            if _check(*arrays):
                grid(L, kernel, a.size, *arrays)

    run.__name__ = name
    run.kernel = kernel
    return run


def _stride_grid(L, kernel, n, *args):
    """v2's launch: a capped grid-stride grid, computed once per shape (``Launcher.launch1d``)."""
    L.launch1d(kernel, n, *args)


_KERNELS = {
    "v1_naive": (
        _full_grid,
        {
            "relu_fwd": _relu_fwd_v1,
            "relu_bwd": _relu_bwd_v1,
            "sigmoid_fwd": _sigmoid_fwd_v1,
            "sigmoid_bwd": _sigmoid_bwd_v1,
            "tanh_fwd": _tanh_fwd_v1,
            "tanh_bwd": _tanh_bwd_v1,
        },
    ),
    "v2_gridstride": (
        _stride_grid,
        {
            "relu_fwd": _relu_fwd_v2,
            "relu_bwd": _relu_bwd_v2,
            "sigmoid_fwd": _sigmoid_fwd_v2,
            "sigmoid_bwd": _sigmoid_bwd_v2,
            "tanh_fwd": _tanh_fwd_v2,
            "tanh_bwd": _tanh_bwd_v2,
        },
    ),
}
_NAMES = ("relu_fwd", "relu_bwd", "sigmoid_fwd", "sigmoid_bwd", "tanh_fwd", "tanh_bwd")
VERSIONS = {fn: {v: _make(fn, table[fn], grid) for v, (grid, table) in _KERNELS.items()} for fn in _NAMES}
DEFAULTS = {fn: "v2_gridstride" for fn in _NAMES}

relu_fwd = VERSIONS["relu_fwd"][DEFAULTS["relu_fwd"]]
relu_bwd = VERSIONS["relu_bwd"][DEFAULTS["relu_bwd"]]
sigmoid_fwd = VERSIONS["sigmoid_fwd"][DEFAULTS["sigmoid_fwd"]]
sigmoid_bwd = VERSIONS["sigmoid_bwd"][DEFAULTS["sigmoid_bwd"]]
tanh_fwd = VERSIONS["tanh_fwd"][DEFAULTS["tanh_fwd"]]
tanh_bwd = VERSIONS["tanh_bwd"][DEFAULTS["tanh_bwd"]]


def use(version):
    """Bind the six elementwise kernels to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.elementwise: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "elementwise"] + sys.argv[1:]))
