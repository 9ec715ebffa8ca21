"""Softmax forward/backward and the softmax cross-entropy loss, over (outer, C, inner) arrays.

Contract (docs/ARCHITECTURE.md, "Kernels"):

    softmax_fwd(x, y)           y[o, :, k] = exp(x[o, :, k] - max) / sum  (max-subtracted)
    softmax_bwd(y, dy, dx)      dx = y * (dy - sum_c dy*y)                (y is the forward output)
    softmax_loss_fwd(prob, label, ignore_label, has_ignore) -> (loss_sum, count)
        loss_sum = sum over non-ignored (o, k) of -log(max(prob[o, label[o,k], k], FLT_MIN))
        count    = the number of non-ignored positions (the layer normalizes)
    softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx)
        dx = scale * (prob - onehot(label)), and 0 at ignored positions

x, y, dy, dx, prob are C-contiguous (outer, C, inner), float32 or float64; label is a float
array of class indices with outer*inner elements (Caffe stores labels as floats; they are
truncated to int as Caffe does).  A label outside [0, C) that is not the ignore label raises
ValueError naming the label and its position (the numba kernels return the position; the thin
Python wrappers in VERSIONS raise).  The loss is accumulated in float64 in every version.

Versions:
  v1_naive   per (o, k): three passes over the C classes (max; sum of exp; exp again / sum),
             stride `inner` between classes.  The loss kernels loop over every element.
  v2_fused   exp computed once (stored into y, then scaled by 1/sum: one division per
             position, not per element).  Loss backward is Caffe's: copy scale*prob (a
             contiguous, vectorized stream), then subtract scale at the label and zero the
             ignored positions.
  v3_inner   for inner > 1 (spatial softmax) the loops run across `inner` (contiguous) with
             per-position max/sum rows, so every pass is a unit-stride vectorizable loop; for
             inner == 1 it is v2.  Serial, nogil: the engine's default.
  v4_prange  v3 with `outer` split across cores by prange (opt-in: numba's workqueue
             threading layer cannot run two parallel regions at once).
"""

import math

import numpy as np
from numba import njit, prange

from . import _versions

__all__ = [
    "softmax_fwd",
    "softmax_bwd",
    "softmax_loss_fwd",
    "softmax_loss_bwd",
    "softmax_fwd_reference",
    "softmax_bwd_reference",
    "softmax_loss_fwd_reference",
    "softmax_loss_bwd_reference",
    "VERSIONS",
    "DEFAULTS",
    "use",
    "FLT_MIN",
]

FLT_MIN = float(np.finfo(np.float32).tiny)  # Caffe clamps prob at FLT_MIN for both dtypes


# -- reference (numpy, float64) ----------------------------------------------------------------
def softmax_fwd_reference(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_bwd_reference(y, dy):
    y = np.asarray(y, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    return y * (dy - (dy * y).sum(axis=1, keepdims=True))


def _labels_reference(prob, label, ignore_label, has_ignore):
    outer, C, inner = prob.shape
    lab = np.asarray(label, dtype=np.float64).reshape(outer, inner)
    with np.errstate(invalid="ignore"):
        li = np.where(np.isfinite(lab), np.trunc(lab), -(2**62)).astype(np.int64)
    keep = ~(li == ignore_label) if has_ignore else np.ones(li.shape, bool)
    bad = keep & ((li < 0) | (li >= C))
    if bad.any():
        o, k = np.argwhere(bad)[0]
        raise ValueError(_bad_label_message(lab[o, k], o, k, C))
    return li, keep


def softmax_loss_fwd_reference(prob, label, ignore_label, has_ignore):
    prob = np.asarray(prob, dtype=np.float64)
    li, keep = _labels_reference(prob, label, ignore_label, has_ignore)
    o, k = np.nonzero(keep)
    p = prob[o, li[o, k], k]
    return float(-np.log(np.maximum(p, FLT_MIN)).sum()), int(keep.sum())


def softmax_loss_bwd_reference(prob, label, ignore_label, has_ignore, scale):
    prob = np.asarray(prob, dtype=np.float64)
    li, keep = _labels_reference(prob, label, ignore_label, has_ignore)
    onehot = np.arange(prob.shape[1])[None, :, None] == li[:, None, :]
    return scale * (prob - onehot) * keep[:, None, :]


def _bad_label_message(value, o, k, C):
    return (
        f"softmax loss: label {value!r} at position (outer={o}, inner={k}) is outside "
        f"[0, {C}) and is not the ignore label"
    )


# -- v1: naive ----------------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def softmax_fwd_v1_naive(x, y):
    outer, C, inner = x.shape
    for o in range(outer):
        for k in range(inner):
            m = x[o, 0, k]
            for c in range(1, C):
                m = max(m, x[o, c, k])
            s = 0.0
            for c in range(C):
                s += math.exp(x[o, c, k] - m)
            for c in range(C):
                y[o, c, k] = math.exp(x[o, c, k] - m) / s


@njit(nogil=True, cache=True)
def softmax_bwd_v1_naive(y, dy, dx):
    outer, C, inner = y.shape
    for o in range(outer):
        for k in range(inner):
            d = 0.0
            for c in range(C):
                d += dy[o, c, k] * y[o, c, k]
            for c in range(C):
                dx[o, c, k] = y[o, c, k] * (dy[o, c, k] - d)


@njit(nogil=True, cache=True)
def _label_at(label, o, k, C, ignore_label, has_ignore):
    """-1: ignored; -2: bad; else the class index."""
    v = label[o, k]
    if not (v > -(2.0**62) and v < 2.0**62):  # NaN, inf, absurd
        return -2
    li = int(v)
    if has_ignore and li == ignore_label:
        return -1
    if li < 0 or li >= C:
        return -2
    return li


@njit(nogil=True, cache=True)
def _loss_fwd_v1(prob, label, ignore_label, has_ignore):
    outer, C, inner = prob.shape
    loss = 0.0
    count = 0
    for o in range(outer):
        for k in range(inner):
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                return loss, count, o * inner + k
            if li == -1:
                continue
            loss -= math.log(max(float(prob[o, li, k]), FLT_MIN))
            count += 1
    return loss, count, -1


@njit(nogil=True, cache=True)
def _loss_bwd_v1(prob, label, ignore_label, has_ignore, scale, dx):
    outer, C, inner = prob.shape
    for o in range(outer):
        for k in range(inner):
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                return o * inner + k
            for c in range(C):
                if li == -1:
                    dx[o, c, k] = 0
                elif c == li:
                    dx[o, c, k] = scale * (prob[o, c, k] - 1)
                else:
                    dx[o, c, k] = scale * prob[o, c, k]
    return -1


# -- v2: fused ------------------------------------------------------------------------------------
def softmax_row(x, y, o, k):
    """y[o, :, k] = softmax(x[o, :, k]); returns (max, sum of exps), from which the fused
    softmax + cross-entropy gets the loss without a log of an underflowed probability.  The one
    source of the per-position softmax, compiled twice (STYLE 3): here with njit for the CPU
    versions, and in kernels/cuda/softmax.py with cuda.jit(device=True) for the GPU's
    one-thread-per-position version and its fused loss kernel."""
    C = x.shape[1]
    m = x[o, 0, k]
    for c in range(1, C):
        if x[o, c, k] > m:
            m = x[o, c, k]
    s = y.dtype.type(0)
    for c in range(C):
        e = math.exp(x[o, c, k] - m)
        y[o, c, k] = e
        s += e
    r = 1 / s
    for c in range(C):
        y[o, c, k] *= r
    return m, s


_softmax_row = njit(nogil=True, cache=True, inline="always")(softmax_row)


@njit(nogil=True, cache=True)
def softmax_fwd_v2_fused(x, y):
    outer, C, inner = x.shape
    for o in range(outer):
        for k in range(inner):
            _softmax_row(x, y, o, k)


@njit(nogil=True, cache=True)
def softmax_bwd_v2_fused(y, dy, dx):
    outer, C, inner = y.shape
    for o in range(outer):
        for k in range(inner):
            d = dx.dtype.type(0)
            for c in range(C):
                d += dy[o, c, k] * y[o, c, k]
            for c in range(C):
                dx[o, c, k] = y[o, c, k] * (dy[o, c, k] - d)


@njit(nogil=True, cache=True)
def _loss_bwd_v2(prob, label, ignore_label, has_ignore, scale, dx):
    outer, C, inner = prob.shape
    sc = dx.dtype.type(scale)
    pf = prob.reshape(-1)
    df = dx.reshape(-1)
    for i in range(pf.size):  # the stream: dx = scale * prob
        df[i] = sc * pf[i]
    for o in range(outer):  # the corrections: O(outer*inner), not O(size)
        for k in range(inner):
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                return o * inner + k
            if li == -1:
                for c in range(C):
                    dx[o, c, k] = 0
            else:
                dx[o, li, k] = sc * (prob[o, li, k] - 1)
    return -1


# -- v3: vectorized across inner ------------------------------------------------------------------
@njit(nogil=True, cache=True, inline="always")
def _softmax_outer(x, y, o, m, s):
    """Softmax of x[o] (C, inner) into y[o] with every pass running along inner; m and s are
    scratch rows of length inner."""
    C, inner = x.shape[1], x.shape[2]
    xo = x[o]
    yo = y[o]
    m[:] = xo[0]
    for c in range(1, C):
        xr = xo[c]
        for k in range(inner):
            if xr[k] > m[k]:
                m[k] = xr[k]
    s[:] = 0
    for c in range(C):
        xr = xo[c]
        yr = yo[c]
        for k in range(inner):
            e = math.exp(xr[k] - m[k])
            yr[k] = e
            s[k] += e
    for k in range(inner):
        s[k] = 1 / s[k]
    for c in range(C):
        yr = yo[c]
        for k in range(inner):
            yr[k] *= s[k]


@njit(nogil=True, cache=True, inline="always")
def _softmax_bwd_outer(y, dy, dx, o, d):
    C, inner = y.shape[1], y.shape[2]
    d[:] = 0
    for c in range(C):
        yr = y[o, c]
        gr = dy[o, c]
        for k in range(inner):
            d[k] += gr[k] * yr[k]
    for c in range(C):
        yr = y[o, c]
        gr = dy[o, c]
        xr = dx[o, c]
        for k in range(inner):
            xr[k] = yr[k] * (gr[k] - d[k])


@njit(nogil=True, cache=True)
def softmax_fwd_v3_inner(x, y):
    outer, C, inner = x.shape
    if inner == 1:
        softmax_fwd_v2_fused(x, y)
        return
    m = np.empty(inner, y.dtype)
    s = np.empty(inner, y.dtype)
    for o in range(outer):
        _softmax_outer(x, y, o, m, s)


@njit(nogil=True, cache=True)
def softmax_bwd_v3_inner(y, dy, dx):
    outer, C, inner = y.shape
    if inner == 1:
        softmax_bwd_v2_fused(y, dy, dx)
        return
    d = np.empty(inner, dx.dtype)
    for o in range(outer):
        _softmax_bwd_outer(y, dy, dx, o, d)


# -- v4: prange across outer ----------------------------------------------------------------------
@njit(nogil=True, cache=True, parallel=True)
def softmax_fwd_v4_prange(x, y):
    outer, C, inner = x.shape
    for o in prange(outer):
        if inner == 1:
            _softmax_row(x, y, o, 0)
        else:
            m = np.empty(inner, y.dtype)
            s = np.empty(inner, y.dtype)
            _softmax_outer(x, y, o, m, s)


@njit(nogil=True, cache=True, parallel=True)
def softmax_bwd_v4_prange(y, dy, dx):
    outer, C, inner = y.shape
    for o in prange(outer):
        d = np.empty(inner, dx.dtype)
        _softmax_bwd_outer(y, dy, dx, o, d)


# -- the Python wrappers the engine calls (they turn a bad-label position into a message) -------
def _as_label(prob, label):
    outer, C, inner = prob.shape
    label = np.asarray(label)
    if label.size != outer * inner:
        raise ValueError(
            f"softmax loss: label has {label.size} elements, prob {prob.shape} needs outer*inner = {outer * inner}"
        )
    return label.reshape(outer, inner)


def _raise_bad(prob, label, pos):
    inner = prob.shape[2]
    o, k = divmod(int(pos), inner)
    raise ValueError(_bad_label_message(label[o, k].item(), o, k, prob.shape[1]))


def _make_loss_fwd(kernel):
    def softmax_loss_fwd(prob, label, ignore_label, has_ignore):
        label = _as_label(prob, label)
        loss, count, bad = kernel(prob, label, int(ignore_label), bool(has_ignore))
        if bad >= 0:
            _raise_bad(prob, label, bad)
        return loss, count

    softmax_loss_fwd.kernel = kernel
    return softmax_loss_fwd


def _make_loss_bwd(kernel):
    def softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
        label = _as_label(prob, label)
        bad = kernel(prob, label, int(ignore_label), bool(has_ignore), float(scale), dx)
        if bad >= 0:
            _raise_bad(prob, label, bad)

    softmax_loss_bwd.kernel = kernel
    return softmax_loss_bwd


_loss_fwd_v1_naive = _make_loss_fwd(_loss_fwd_v1)
_loss_bwd_v1_naive = _make_loss_bwd(_loss_bwd_v1)
_loss_bwd_v2_fused = _make_loss_bwd(_loss_bwd_v2)

VERSIONS = {
    "softmax_fwd": {
        "v1_naive": softmax_fwd_v1_naive,
        "v2_fused": softmax_fwd_v2_fused,
        "v3_inner": softmax_fwd_v3_inner,
        "v4_prange": softmax_fwd_v4_prange,
    },
    "softmax_bwd": {
        "v1_naive": softmax_bwd_v1_naive,
        "v2_fused": softmax_bwd_v2_fused,
        "v3_inner": softmax_bwd_v3_inner,
        "v4_prange": softmax_bwd_v4_prange,
    },
    # the loss is O(outer*inner) work, a vanishing part of a step: two rungs are enough
    "softmax_loss_fwd": {"v1_naive": _loss_fwd_v1_naive},
    "softmax_loss_bwd": {"v1_naive": _loss_bwd_v1_naive, "v2_fused": _loss_bwd_v2_fused},
}
DEFAULTS = {
    "softmax_fwd": "v3_inner",
    "softmax_bwd": "v3_inner",
    "softmax_loss_fwd": "v1_naive",
    "softmax_loss_bwd": "v2_fused",
}
REFERENCES = {
    "softmax_fwd": softmax_fwd_reference,
    "softmax_bwd": softmax_bwd_reference,
    "softmax_loss_fwd": softmax_loss_fwd_reference,
    "softmax_loss_bwd": softmax_loss_bwd_reference,
}

softmax_fwd = VERSIONS["softmax_fwd"][DEFAULTS["softmax_fwd"]]
softmax_bwd = VERSIONS["softmax_bwd"][DEFAULTS["softmax_bwd"]]
softmax_loss_fwd = VERSIONS["softmax_loss_fwd"][DEFAULTS["softmax_loss_fwd"]]
softmax_loss_bwd = VERSIONS["softmax_loss_bwd"][DEFAULTS["softmax_loss_bwd"]]


def use(version):
    """Bind every softmax kernel that has ``version`` to it (the others keep theirs), or
    "default"."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("softmax")


# -- self-check and benchmark: python -m kernels.softmax --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.softmax``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import softmax as SM

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(4)
    shapes = [
        ("LeNet loss (64, 10, 1)", (64, 10, 1)),
        ("(256, 1000, 1)", (256, 1000, 1)),
        ("spatial (4, 21, 4096)", (4, 21, 4096)),
    ]
    if quick:
        shapes = shapes[:2]
    cases = []
    for name, shp in shapes:
        x = (rng.standard_normal(shp) * 3).astype(F32)
        y = np.empty_like(x)
        dy = rng.standard_normal(shp).astype(F32)
        dx = np.empty_like(x)
        y_ref = SM.softmax_fwd_reference(x)
        yv = y_ref.astype(F32)
        dx_ref = SM.softmax_bwd_reference(yv, dy)
        eps = float(np.finfo(F32).eps)

        def run_f(fn, x=x, y=y):
            return lambda: fn(x, y)

        def run_b(fn, yv=yv, dy=dy, dx=dx):
            return lambda: fn(yv, dy, dx)

        def check_f(fn, y=y, y_ref=y_ref, C=shp[1], x=x):
            close(y, y_ref, (C + 30 + np.ptp(x)) * eps * y_ref + 1e-37, "softmax_fwd")

        def check_b(fn, dx=dx, dx_ref=dx_ref, yv=yv, dy=dy, C=shp[1]):
            mag = np.abs(yv) * (np.abs(dy) + np.abs(dy * yv).sum(1, keepdims=True))
            close(dx, dx_ref, sum_tol(C, mag), "softmax_bwd")

        def base_f(x=x, y=y):
            np.subtract(x, x.max(axis=1, keepdims=True), out=y)
            np.exp(y, out=y)
            y /= y.sum(axis=1, keepdims=True)

        def base_b(yv=yv, dy=dy, dx=dx):
            np.multiply(dy, yv, out=dx)
            s = dx.sum(axis=1, keepdims=True)
            np.subtract(dy, s, out=dx)
            dx *= yv

        cases.append(Case("softmax", "softmax_fwd", name, "memory", 0, 8.0 * x.size, run_f, check_f, baseline=base_f))
        cases.append(Case("softmax", "softmax_bwd", name, "memory", 0, 12.0 * x.size, run_b, check_b, baseline=base_b))
    # the loss, on LeNet's shape
    prob = SM.softmax_fwd_reference(rng.standard_normal((64, 10, 1))).astype(F32)
    label = rng.integers(0, 10, (64, 1)).astype(F32)
    loss_ref = SM.softmax_loss_fwd_reference(prob, label, -1, False)
    g_ref = SM.softmax_loss_bwd_reference(prob, label, -1, False, 1 / 64)
    g = np.empty_like(prob)

    def run_lf(fn):
        return lambda: fn(prob, label, -1, False)

    def check_lf(fn):
        got = fn(prob, label, -1, False)
        assert got[1] == loss_ref[1] and abs(got[0] - loss_ref[0]) <= 1e-9 * abs(loss_ref[0])

    def run_lb(fn):
        return lambda: fn(prob, label, -1, False, 1 / 64, g)

    def check_lb(fn):
        close(g, g_ref, 3 * float(np.finfo(F32).eps) * (np.abs(g_ref) + 1 / 64), "softmax_loss_bwd")

    cases.append(
        Case(
            "softmax",
            "softmax_loss_fwd",
            "LeNet (64, 10, 1)",
            "memory",
            0,
            4.0 * (prob.size + label.size),
            run_lf,
            check_lf,
        )
    )
    cases.append(
        Case(
            "softmax",
            "softmax_loss_bwd",
            "LeNet (64, 10, 1)",
            "memory",
            0,
            4.0 * (2 * prob.size + label.size),
            run_lb,
            check_lb,
        )
    )
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("softmax"))
