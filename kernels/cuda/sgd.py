"""The SGD step with momentum and L2 weight decay on the GPU (Caffe's sgd_solver.cu), over flat
1-d arrays.

Contract: the CPU family's (``kernels/sgd.py``), the same name and argument order::

    sgd_step(w, g, h, momentum, local_rate, decay)
        the whole iteration for one parameter blob, fused: L2 regularization, momentum and the
        weight update in ONE pass:  h = momentum * h + local_rate * (g + decay * w);  w -= h
        (g is only read)

Done with xp arithmetic that is Caffe's three BLAS-1 calls and a temporary: 7 passes over
memory.  The kernel makes it one pass: 3 loads and 2 stores per element.  Checked against the
CPU file's float64 reference.  Each wrapper takes the launcher ``L`` first.

Versions (thread mapping: thread i, grid-stride, element i, coalesced):
  v1_gridstride   the only one: a memory-bound stream has nothing else to win.
"""

from numba import cuda

from .. import _versions
from ..sgd import REFERENCES  # noqa: F401  (the float64 reference the tests check against)

__all__ = ["sgd_step", "VERSIONS", "DEFAULTS", "use"]


@cuda.jit
def _sgd_step(w, g, h, momentum, rate, decay):
    i = cuda.grid(1)
    while i < g.size:
        wi = w[i]
        v = momentum * h[i] + rate * (g[i] + decay * wi)
        h[i] = v
        w[i] = wi - v
        i += cuda.gridsize(1)


def _check(*arrays):
    for a in arrays:
        if a.ndim != 1 or a.size != arrays[0].size or a.dtype != arrays[0].dtype:
            raise ValueError(
                f"sgd_step: arrays must be 1-d of one length and dtype, got "
                f"{[(tuple(b.shape), str(b.dtype)) for b in arrays]}"
            )
    return arrays[0].size


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


VERSIONS = {"sgd_step": {"v1_gridstride": sgd_step_v1_gridstride}}
DEFAULTS = {"sgd_step": "v1_gridstride"}

sgd_step = VERSIONS["sgd_step"][DEFAULTS["sgd_step"]]


def use(version):
    """Bind sgd_step to ``version`` (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.sgd: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "sgd"] + sys.argv[1:]))
