"""Elementwise activations on flat 1-d arrays: ReLU (leaky), sigmoid, tanh, forward/backward.

Contract (docs/ARCHITECTURE.md, "Kernels"); all arrays 1-d, same length, float32 or float64;
every kernel may run in place (y is x, dx is dy):

    relu_fwd(x, slope, y)        y  = x if x > 0 else slope * x
    relu_bwd(x, dy, slope, dx)   dx = dy * ((x > 0) + slope * (x <= 0))      (Caffe's formula)
    sigmoid_fwd(x, y)            y  = 1 / (1 + exp(-x))
    sigmoid_bwd(y, dy, dx)       dx = dy * y * (1 - y)                       (y: forward output)
    tanh_fwd(x, y)               y  = tanh(x)
    tanh_bwd(y, dy, dx)          dx = dy * (1 - y*y)

These are memory-bound streams (a few flops per 8-16 bytes moved): their ceiling is the
machine's copy bandwidth, which the benchmark measures alongside.

Versions:
  v1_naive   the formula as written, with Python float constants: for float32 arrays numba
             widens every operation to float64 and back, and the `if` in ReLU is a branch.
  v2_typed   constants of the array's own dtype and branch-free selects, so LLVM emits packed
             single-precision SIMD for ReLU and the backward passes (exp stays a scalar call:
             numba vectorizes it only with Intel's SVML, which is not a dependency); tanh
             through one exp instead of libm's tanh (4x slower here).  Serial, nogil: the
             engine's default.
  v3_prange  v2 split across cores by prange (opt-in: numba's workqueue threading layer cannot
             run two parallel regions at once; for arrays that fit in cache the fork/join costs
             more than it saves).
"""

import math

import numpy as np
from numba import njit, prange

from . import _versions

__all__ = ["relu_fwd", "relu_bwd", "sigmoid_fwd", "sigmoid_bwd", "tanh_fwd", "tanh_bwd", "VERSIONS", "DEFAULTS", "use"]


# -- reference (numpy, float64) ----------------------------------------------------------------
def _f64(a):
    return np.asarray(a, dtype=np.float64)


def relu_fwd_reference(x, slope):
    x = _f64(x)
    return np.maximum(x, 0) + slope * np.minimum(x, 0)


def relu_bwd_reference(x, dy, slope):
    x, dy = _f64(x), _f64(dy)
    return dy * ((x > 0) + slope * (x <= 0))


def sigmoid_fwd_reference(x):
    x = _f64(x)
    e = np.exp(-np.abs(x))  # never overflows; accurate in both tails
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def sigmoid_bwd_reference(y, dy):
    y, dy = _f64(y), _f64(dy)
    return dy * y * (1 - y)


def tanh_fwd_reference(x):
    return np.tanh(_f64(x))


def tanh_bwd_reference(y, dy):
    y, dy = _f64(y), _f64(dy)
    return dy * (1 - y * y)


# -- v1: naive ----------------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def relu_fwd_v1_naive(x, slope, y):
    for i in range(x.size):
        if x[i] > 0:
            y[i] = x[i]
        else:
            y[i] = slope * x[i]


@njit(nogil=True, cache=True)
def relu_bwd_v1_naive(x, dy, slope, dx):
    for i in range(x.size):
        dx[i] = dy[i] * ((1.0 if x[i] > 0 else 0.0) + slope * (1.0 if x[i] <= 0 else 0.0))


@njit(nogil=True, cache=True)
def sigmoid_fwd_v1_naive(x, y):
    for i in range(x.size):
        y[i] = 1.0 / (1.0 + math.exp(-float(x[i])))


@njit(nogil=True, cache=True)
def sigmoid_bwd_v1_naive(y, dy, dx):
    for i in range(y.size):
        dx[i] = dy[i] * y[i] * (1.0 - y[i])


@njit(nogil=True, cache=True)
def tanh_fwd_v1_naive(x, y):
    for i in range(x.size):
        y[i] = math.tanh(float(x[i]))


@njit(nogil=True, cache=True)
def tanh_bwd_v1_naive(y, dy, dx):
    for i in range(y.size):
        dx[i] = dy[i] * (1.0 - y[i] * y[i])


# -- v2: typed constants, branch-free -----------------------------------------------------------
@njit(nogil=True, cache=True, inline="always")
def _relu_fwd_range(x, s, y, lo, hi):
    for i in range(lo, hi):
        v = x[i]
        y[i] = v if v > 0 else s * v


@njit(nogil=True, cache=True, inline="always")
def _relu_bwd_range(x, dy, s, dx, lo, hi):
    """The factor as two compares (a NaN input passes neither: factor 0, as Caffe's formula):
    selects, no branch, so the loop stays fast when it cannot be vectorized -- in place
    (dx is dy, ReLU's usual form) LLVM's overlap check fails, and a branch on the sign of
    random data cost 55 us per 32k values instead of 4 (LeNet's relu1)."""
    one = dx.dtype.type(1)
    zero = dx.dtype.type(0)
    for i in range(lo, hi):
        v = x[i]
        pos = one if v > 0 else zero
        neg = s if v <= 0 else zero
        dx[i] = dy[i] * (pos + neg)


@njit(nogil=True, cache=True, inline="always")
def _sigmoid_fwd_range(x, y, lo, hi):
    one = y.dtype.type(1)
    for i in range(lo, hi):
        y[i] = one / (one + math.exp(-x[i]))


@njit(nogil=True, cache=True, inline="always")
def _sigmoid_bwd_range(y, dy, dx, lo, hi):
    one = dx.dtype.type(1)
    for i in range(lo, hi):
        v = y[i]
        dx[i] = dy[i] * v * (one - v)


@njit(nogil=True, cache=True, inline="always")
def _tanh_fwd_range(x, y, lo, hi):
    """tanh(|v|) = (1 - e) / (1 + e), e = exp(-2|v|): one exp (libm's tanh costs four times
    as much here); below |v| = 0.5 the form 1 - e cancels, so there expm1 keeps the accuracy."""
    one = y.dtype.type(1)
    m2 = y.dtype.type(-2)
    half = y.dtype.type(0.5)
    for i in range(lo, hi):
        v = x[i]
        a = abs(v)
        if a >= half:
            e = math.exp(m2 * a)
            r = (one - e) / (one + e)
        else:
            e = math.expm1(m2 * a)
            r = -e / (one + one + e)
        y[i] = r if v >= 0 else -r


@njit(nogil=True, cache=True, inline="always")
def _tanh_bwd_range(y, dy, dx, lo, hi):
    one = dx.dtype.type(1)
    for i in range(lo, hi):
        v = y[i]
        dx[i] = dy[i] * (one - v * v)


@njit(nogil=True, cache=True)
def relu_fwd_v2_typed(x, slope, y):
    _relu_fwd_range(x, y.dtype.type(slope), y, 0, x.size)


@njit(nogil=True, cache=True)
def relu_bwd_v2_typed(x, dy, slope, dx):
    _relu_bwd_range(x, dy, dx.dtype.type(slope), dx, 0, x.size)


@njit(nogil=True, cache=True)
def sigmoid_fwd_v2_typed(x, y):
    _sigmoid_fwd_range(x, y, 0, x.size)


@njit(nogil=True, cache=True)
def sigmoid_bwd_v2_typed(y, dy, dx):
    _sigmoid_bwd_range(y, dy, dx, 0, y.size)


@njit(nogil=True, cache=True)
def tanh_fwd_v2_typed(x, y):
    _tanh_fwd_range(x, y, 0, x.size)


@njit(nogil=True, cache=True)
def tanh_bwd_v2_typed(y, dy, dx):
    _tanh_bwd_range(y, dy, dx, 0, y.size)


# -- v3: prange over chunks -----------------------------------------------------------------------
_CHUNK = 16384  # elements per task: 64 KB of float32, big enough to amortize a task


@njit(nogil=True, cache=True, parallel=True)
def relu_fwd_v3_prange(x, slope, y):
    s = y.dtype.type(slope)
    for b in prange((x.size + _CHUNK - 1) // _CHUNK):
        _relu_fwd_range(x, s, y, b * _CHUNK, min((b + 1) * _CHUNK, x.size))


@njit(nogil=True, cache=True, parallel=True)
def relu_bwd_v3_prange(x, dy, slope, dx):
    s = dx.dtype.type(slope)
    for b in prange((x.size + _CHUNK - 1) // _CHUNK):
        _relu_bwd_range(x, dy, s, dx, b * _CHUNK, min((b + 1) * _CHUNK, x.size))


@njit(nogil=True, cache=True, parallel=True)
def sigmoid_fwd_v3_prange(x, y):
    for b in prange((x.size + _CHUNK - 1) // _CHUNK):
        _sigmoid_fwd_range(x, y, b * _CHUNK, min((b + 1) * _CHUNK, x.size))


@njit(nogil=True, cache=True, parallel=True)
def sigmoid_bwd_v3_prange(y, dy, dx):
    for b in prange((y.size + _CHUNK - 1) // _CHUNK):
        _sigmoid_bwd_range(y, dy, dx, b * _CHUNK, min((b + 1) * _CHUNK, y.size))


@njit(nogil=True, cache=True, parallel=True)
def tanh_fwd_v3_prange(x, y):
    for b in prange((x.size + _CHUNK - 1) // _CHUNK):
        _tanh_fwd_range(x, y, b * _CHUNK, min((b + 1) * _CHUNK, x.size))


@njit(nogil=True, cache=True, parallel=True)
def tanh_bwd_v3_prange(y, dy, dx):
    for b in prange((y.size + _CHUNK - 1) // _CHUNK):
        _tanh_bwd_range(y, dy, dx, b * _CHUNK, min((b + 1) * _CHUNK, y.size))


_NAMES = ("relu_fwd", "relu_bwd", "sigmoid_fwd", "sigmoid_bwd", "tanh_fwd", "tanh_bwd")
_LADDER = ("v1_naive", "v2_typed", "v3_prange")
VERSIONS = {fn: {v: globals()[f"{fn}_{v}"] for v in _LADDER} for fn in _NAMES}
DEFAULTS = {fn: "v2_typed" for fn in _NAMES}
REFERENCES = {fn: globals()[f"{fn}_reference"] for fn in _NAMES}

relu_fwd = VERSIONS["relu_fwd"][DEFAULTS["relu_fwd"]]
relu_bwd = VERSIONS["relu_bwd"][DEFAULTS["relu_bwd"]]
sigmoid_fwd = VERSIONS["sigmoid_fwd"][DEFAULTS["sigmoid_fwd"]]
sigmoid_bwd = VERSIONS["sigmoid_bwd"][DEFAULTS["sigmoid_bwd"]]
tanh_fwd = VERSIONS["tanh_fwd"][DEFAULTS["tanh_fwd"]]
tanh_bwd = VERSIONS["tanh_bwd"][DEFAULTS["tanh_bwd"]]


def use(version):
    """Bind all six elementwise kernels to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("elementwise")


# -- self-check and benchmark: python -m kernels.elementwise --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.elementwise``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import elementwise as EW

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(5)
    sizes = [("LeNet ip1 top", 64 * 500), ("CIFAR conv1 top", 100 * 32 * 32 * 32), ("16 M", 1 << 24)]
    if quick:
        sizes = sizes[:2]
    eps = float(np.finfo(F32).eps)
    cases = []
    for name, n in sizes:
        x = (rng.standard_normal(n) * 3).astype(F32)
        dy = rng.standard_normal(n).astype(F32)
        y = np.empty_like(x)
        ys = EW.sigmoid_fwd_reference(x).astype(F32)
        yt = EW.tanh_fwd_reference(x).astype(F32)
        ax, ad = np.abs(x.astype(np.float64)), np.abs(dy.astype(np.float64))
        mags = dict(
            relu_fwd=ax,
            relu_bwd=ad,
            sigmoid_fwd=np.abs(ys.astype(np.float64)),
            sigmoid_bwd=ad * np.abs(ys) * (1 + np.abs(ys)),
            tanh_fwd=np.abs(yt.astype(np.float64)),
            tanh_bwd=ad * (1 + yt * yt),
        )
        specs = [
            ("relu_fwd", (x, 0.0), EW.relu_fwd_reference(x, 0.0), 8.0 * n, lambda x=x, y=y: np.maximum(x, 0, out=y)),
            (
                "relu_bwd",
                (x, dy, 0.0),
                EW.relu_bwd_reference(x, dy, 0.0),
                12.0 * n,
                lambda x=x, dy=dy, y=y: np.multiply(dy, x > 0, out=y),
            ),
            (
                "sigmoid_fwd",
                (x,),
                EW.sigmoid_fwd_reference(x),
                8.0 * n,
                lambda x=x, y=y: (
                    np.negative(x, out=y),
                    np.exp(y, out=y),
                    np.add(y, 1, out=y),
                    np.reciprocal(y, out=y),
                ),
            ),
            ("sigmoid_bwd", (ys, dy), EW.sigmoid_bwd_reference(ys, dy), 12.0 * n, None),
            ("tanh_fwd", (x,), EW.tanh_fwd_reference(x), 8.0 * n, lambda x=x, y=y: np.tanh(x, out=y)),
            ("tanh_bwd", (yt, dy), EW.tanh_bwd_reference(yt, dy), 12.0 * n, None),
        ]
        for fn_name, args, ref, nbytes, base in specs:

            def run(fn, args=args, y=y):
                return lambda: fn(*args, y)

            def check(fn, y=y, ref=ref, what=fn_name, mag=mags[fn_name]):
                close(y, ref, 8 * eps * mag + 2e-38, what)

            cases.append(Case("elementwise", fn_name, f"{name} n={n}", "memory", 0, nbytes, run, check, baseline=base))
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("elementwise"))
