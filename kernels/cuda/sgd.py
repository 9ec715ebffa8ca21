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

__all__ = ["sgd_step", "sgd_step_segments", "VERSIONS", "DEFAULTS", "use"]


@cuda.jit(device=True)
def _sgd_grid(w, g, h, momentum, rate, decay):
    """The body both kernels share: h = momentum h + rate (g + decay w); w -= h (grid-stride)."""
    i = cuda.grid(1)
    while i < g.size:
        wi = w[i]
        v = momentum * h[i] + rate * (g[i] + decay * wi)
        h[i] = v
        w[i] = wi - v
        i += cuda.gridsize(1)


@cuda.jit
def _sgd_step(w, g, h, momentum, rate, decay):
    _sgd_grid(w, g, h, momentum, rate, decay)


@cuda.jit
def _sgd_step_dev(w, g, h, momentum, rate, decay):
    """_sgd_step with the rate read on the device (rate[0]): a captured CUDA graph replays with
    the learning rate of the iteration, written there before the replay."""
    _sgd_grid(w, g, h, momentum, rate[0], decay)


@cuda.jit
def _sgd_step_segments(w, g, h, offsets, momentum, rates, decays):
    """Every parameter of a net in ONE launch: w, g, h are the flat vectors of all of them and
    parameter s is [offsets[s], offsets[s+1]); thread i (grid-stride) finds its s by bisection
    over the few offsets and applies that parameter's rate and decay (read on the device)."""
    n = offsets.size - 1
    i = cuda.grid(1)
    while i < g.size:
        lo = 0
        hi = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if offsets[mid] <= i:
                lo = mid
            else:
                hi = mid
        wi = w[i]
        v = momentum * h[i] + rates[lo] * (g[i] + decays[lo] * wi)
        h[i] = v
        w[i] = wi - v
        i += cuda.gridsize(1)


def sgd_step_segments(L, w, g, h, offsets, momentum, rates, decays):
    """sgd_step over every parameter at once (see ``_sgd_step_segments``): offsets (n+1 int64),
    rates and decays (n, the arrays' dtype) are device arrays."""
    _check(w, g, h)
    if offsets.ndim != 1 or rates.shape != (offsets.size - 1,) or decays.shape != rates.shape:
        raise ValueError(
            f"sgd_step_segments: offsets (n+1,), rates and decays (n,), got {tuple(offsets.shape)}, "
            f"{tuple(rates.shape)}, {tuple(decays.shape)}"
        )
    if g.size:
        L.launch1d(_sgd_step_segments, g.size, w, g, h, offsets, L.scalar(momentum, g.dtype), rates, decays)


def _check(*arrays):
    for a in arrays:
        if a.ndim != 1 or a.size != arrays[0].size or a.dtype != arrays[0].dtype:
            raise ValueError(
                f"sgd_step: arrays must be 1-d of one length and dtype, got "
                f"{[(tuple(b.shape), str(b.dtype)) for b in arrays]}"
            )
    return arrays[0].size


def sgd_step_v1_gridstride(L, w, g, h, momentum, local_rate, decay):
    """``local_rate``: a number, or a 1-element device array of the arrays' dtype (read by the
    kernel: the rate can change between replays of a captured step)."""
    if hasattr(local_rate, "shape"):
        if _check(w, g, h):
            L.launch1d(
                _sgd_step_dev,
                g.size,
                w,
                g,
                h,
                L.scalar(momentum, g.dtype),
                local_rate.reshape(1),
                L.scalar(decay, g.dtype),
            )
        return
    if _check(w, g, h):
        L.launch1d(
            _sgd_step,
            g.size,
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
