"""The SGD update with momentum and L2 weight decay (Caffe's SGDSolver), on flat 1-d arrays.

Contract (the solver calls it once per parameter blob; all arrays 1-d, same length, float32
or float64; w and h are updated in place, g is only read):

    sgd_step(w, g, h, momentum, local_rate, decay)
        h = momentum * h + local_rate * (g + decay * w)     (Caffe: Regularize, then
        w = w - h                                             ComputeUpdateValue, then Update)

The same name and argument order as the backend contract (minicaffe/backend/contract.py) and
the GPU family (kernels/cuda/sgd.py).  local_rate and decay are the blob's effective values
(base_lr * lr_mult * schedule, weight_decay * decay_mult): the solver multiplies them out.
Caffe also copies h into the gradient (the diff then holds the update); this kernel leaves g
alone (one store fewer per element), and the solver clears it before the next step anyway.

It is a pure stream (3 arrays read, 2 written: 20 bytes per float32 for 4 flops), so the
ceiling is the machine's copy bandwidth.

Versions:
  v1_naive   Caffe's three BLAS-1 passes (g' = g + wd*w into a scratch array; h = m*h + lr*g';
             w -= h): seven array sweeps and a temporary.
  v2_fused   one pass: each element of w, g, h is loaded once and w, h stored once (5 sweeps,
             no temporary); dtype-typed constants so float32 stays float32 and vectorizes.
             Serial, nogil: the engine's default.
  v3_prange  v2 split across cores by prange (opt-in: numba's workqueue threading layer
             cannot run two parallel regions at once; worth it only for big blobs).
"""

import numpy as np
from numba import njit, prange

from . import _versions

__all__ = ["sgd_step", "sgd_step_reference", "VERSIONS", "DEFAULTS", "use"]


def sgd_step_reference(w, g, h, momentum, local_rate, decay):
    """float64 (w_new, h_new); the inputs are not modified."""
    w, g, h = (np.asarray(a, dtype=np.float64) for a in (w, g, h))
    h_new = momentum * h + local_rate * (g + decay * w)
    return w - h_new, h_new


@njit(nogil=True, cache=True)
def _check(w, g, h):
    if w.shape != g.shape or w.shape != h.shape:
        raise ValueError("sgd_step: w, g and h must have the same shape")


@njit(nogil=True, cache=True)
def sgd_step_v1_naive(w, g, h, momentum, local_rate, decay):
    _check(w, g, h)
    n = w.size
    t = np.empty_like(g)
    for i in range(n):  # Regularize: t = g + decay * w     (caffe_axpy)
        t[i] = g[i] + decay * w[i]
    for i in range(n):  # ComputeUpdateValue: h = lr*t + m*h  (caffe_cpu_axpby)
        h[i] = local_rate * t[i] + momentum * h[i]
    for i in range(n):  # Update: w -= h                 (caffe_axpy)
        w[i] -= h[i]


@njit(nogil=True, cache=True, inline="always")
def _fused_range(w, g, h, rate, m, decay, lo, hi):
    for i in range(lo, hi):
        wi = w[i]
        hi_ = m * h[i] + rate * (g[i] + decay * wi)
        h[i] = hi_
        w[i] = wi - hi_


@njit(nogil=True, cache=True)
def sgd_step_v2_fused(w, g, h, momentum, local_rate, decay):
    _check(w, g, h)
    t = w.dtype.type
    _fused_range(w, g, h, t(local_rate), t(momentum), t(decay), 0, w.size)


_CHUNK = 16384


@njit(nogil=True, cache=True, parallel=True)
def sgd_step_v3_prange(w, g, h, momentum, local_rate, decay):
    _check(w, g, h)
    t = w.dtype.type
    a, m, d = t(local_rate), t(momentum), t(decay)
    n = w.size
    for b in prange((n + _CHUNK - 1) // _CHUNK):
        _fused_range(w, g, h, a, m, d, b * _CHUNK, min((b + 1) * _CHUNK, n))


VERSIONS = {
    "sgd_step": {
        "v1_naive": sgd_step_v1_naive,
        "v2_fused": sgd_step_v2_fused,
        "v3_prange": sgd_step_v3_prange,
    }
}
DEFAULTS = {"sgd_step": "v2_fused"}
REFERENCES = {"sgd_step": sgd_step_reference}

sgd_step = VERSIONS["sgd_step"][DEFAULTS["sgd_step"]]


def use(version):
    """Bind sgd_step to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


from . import _apply_env  # noqa: E402

_apply_env("sgd")


# -- self-check and benchmark: python -m kernels.sgd --------------------------------------------
def bench_cases(quick, sizes=()):
    """The benchmark's cases (``python -m kernels.sgd``, ``python -m kernels.bench``): inputs, a
    runner per version, a check against the float64 reference, the work done."""
    from kernels import sgd as SG

    from ._bench import F32, Case, close, sum_tol  # noqa: F401

    rng = np.random.default_rng(6)
    sizes = [("LeNet all params", 431080), ("16 M", 1 << 24)][: 1 if quick else 2]
    cases = []
    for name, n in sizes:
        w0, g, h0 = (rng.standard_normal(n).astype(F32) for _ in range(3))
        w, h = w0.copy(), h0.copy()
        w_ref, h_ref = SG.sgd_step_reference(w0, g, h0, 0.9, 0.01, 5e-4)

        def run(fn, w=w, g=g, h=h, w0=w0, h0=h0):
            return lambda: fn(w, g, h, 0.9, 0.01, 5e-4)

        def check(fn, w=w, h=h, w0=w0, h0=h0, g=g, w_ref=w_ref, h_ref=h_ref):
            # one step from the initial state (the warm-up calls kept updating w and h)
            w[...], h[...] = w0, h0
            fn(w, g, h, 0.9, 0.01, 5e-4)
            eps = float(np.finfo(F32).eps)
            close(h, h_ref, 8 * eps * (np.abs(h_ref) + np.abs(w0) + np.abs(g)), "sgd h")
            close(w, w_ref, 8 * eps * (np.abs(w0) + np.abs(h0) + np.abs(g)), "sgd w")

        def base(w=w, g=g, h=h):
            h *= 0.9
            h += 0.01 * (g + 5e-4 * w)
            w -= h

        cases.append(Case("sgd", "sgd_step", f"{name} n={n}", "memory", 0, 20.0 * n, run, check, baseline=base))
    return cases


if __name__ == "__main__":
    import sys

    from kernels._bench import family_main

    sys.exit(family_main("sgd"))
