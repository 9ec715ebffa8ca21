"""The SGD-with-momentum update on the GPU (Caffe's sgd_solver.cu), over flat 1-d arrays.

Contract (the update the solver's ``SGDSolver.compute_update_value`` does with xp arithmetic)::

    sgd_update(g, h, momentum, local_rate)
        h = momentum * h + local_rate * g;   g = h          (g then holds the step; w -= g follows)
    sgd_step(w, g, h, momentum, local_rate, decay)
        the whole iteration for one parameter blob, fused: L2 regularization, momentum, and the
        weight update in ONE pass:  g' = g + decay * w;  h = momentum * h + local_rate * g';
        w -= h;  g = h

Done with xp arithmetic, ``sgd_update`` is 3 CuPy kernels and a temporary (``h *= m``,
``local_rate * g``, ``h += ...``, then ``g[...] = h``): 4 passes over memory.  The kernels here
make it one pass: 2 loads and 2 stores per element (sgd_step: 3 and 3, instead of 7 passes).
The float64 references below are what the tests check against.

Versions (thread mapping: thread i, grid-stride, element i, coalesced):
  v1_gridstride   the only one: a memory-bound stream has nothing else to win.
"""

import numpy as np
from numba import cuda

from .. import _versions

__all__ = ["sgd_update", "sgd_step", "sgd_update_reference", "sgd_step_reference", "VERSIONS", "DEFAULTS", "use"]


def sgd_update_reference(g, h, momentum, local_rate):
    """float64 (g_new, h_new)."""
    h = momentum * np.asarray(h, np.float64) + local_rate * np.asarray(g, np.float64)
    return h.copy(), h


def sgd_step_reference(w, g, h, momentum, local_rate, decay):
    """float64 (w_new, g_new, h_new)."""
    w = np.asarray(w, np.float64)
    g = np.asarray(g, np.float64) + decay * w
    h = momentum * np.asarray(h, np.float64) + local_rate * g
    return w - h, h.copy(), h


@cuda.jit
def _sgd_update(g, h, momentum, rate):
    i = cuda.grid(1)
    while i < g.size:
        v = momentum * h[i] + rate * g[i]
        h[i] = v
        g[i] = v
        i += cuda.gridsize(1)


@cuda.jit
def _sgd_step(w, g, h, momentum, rate, decay):
    i = cuda.grid(1)
    while i < g.size:
        wi = w[i]
        v = momentum * h[i] + rate * (g[i] + decay * wi)
        h[i] = v
        g[i] = v
        w[i] = wi - v
        i += cuda.gridsize(1)


def _check(*arrays):
    for a in arrays:
        if a.ndim != 1 or a.size != arrays[0].size or a.dtype != arrays[0].dtype:
            raise ValueError(
                f"sgd: arrays must be 1-d of one length and dtype, got "
                f"{[(tuple(b.shape), str(b.dtype)) for b in arrays]}"
            )
    return arrays[0].size


def sgd_update_v1_gridstride(L, g, h, momentum, local_rate):
    if _check(g, h):
        L.launch(
            _sgd_update,
            L.blocks(g.size),
            L.config.threads,
            g,
            h,
            L.scalar(momentum, g.dtype),
            L.scalar(local_rate, g.dtype),
        )


def sgd_step_v1_gridstride(L, w, g, h, momentum, local_rate, decay):
    if _check(w, g, h):
        L.launch(
            _sgd_step,
            L.blocks(g.size),
            L.config.threads,
            w,
            g,
            h,
            L.scalar(momentum, g.dtype),
            L.scalar(local_rate, g.dtype),
            L.scalar(decay, g.dtype),
        )


VERSIONS = {
    "sgd_update": {"v1_gridstride": sgd_update_v1_gridstride},
    "sgd_step": {"v1_gridstride": sgd_step_v1_gridstride},
}
DEFAULTS = {"sgd_update": "v1_gridstride", "sgd_step": "v1_gridstride"}
REFERENCES = {"sgd_update": sgd_update_reference, "sgd_step": sgd_step_reference}

sgd_update = VERSIONS["sgd_update"][DEFAULTS["sgd_update"]]
sgd_step = VERSIONS["sgd_step"][DEFAULTS["sgd_step"]]


def use(version):
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)
