"""Softmax and the softmax cross-entropy loss on the GPU, over (outer, C, inner) arrays.

Contract: the CPU family's (``kernels/softmax.py``)::

    softmax_fwd(x, y)                 y = exp(x - max) / sum over C
    softmax_bwd(y, dy, dx)            dx = y * (dy - sum_c dy*y)
    softmax_loss_fwd(prob, label, ignore_label, has_ignore) -> (loss_sum, count)   (floats)
    softmax_loss_bwd(prob, label, ignore_label, has_ignore, scale, dx)

plus a fused forward, one pass over the scores and one launch instead of two::

    softmax_xent_fwd(x, label, ignore_label, has_ignore, prob) -> (loss_sum, count)
        prob = softmax(x), and the loss of softmax_loss_fwd, in one kernel

(a lab kernel, outside the backend contract: the engine's SoftmaxWithLoss runs softmax_fwd,
then softmax_loss_fwd, on every backend alike).

Labels are floats truncated to int; a label outside [0, C) that is not the ignore label makes
the loss forward raise ValueError naming its position (the kernel records the first bad position
in the same 3-number result it returns: no extra transfer).  The loss backward does not
synchronize to check again -- the forward already did, on the same labels -- it writes NaN at a
bad label's row instead, so a bad label can never pass silently.  The loss is accumulated in
float64 (and atomically added in float64: needs compute capability >= 6.0).

The loss forward is the one kernel that must return numbers to the host: it does so with ONE
device->host copy of 3 float64 (loss, count, first bad position), through the launcher's counted
``to_host``.

Versions:
  v1_thread  one thread per position (o, k), looping over the C classes (max, sum of exps,
             write): for spatial softmax (inner > 1) consecutive threads take consecutive k,
             so every pass is a coalesced row of the (C, inner) plane; for inner == 1 one thread
             walks a whole row alone.
  v2_block   one block per position (grid-stride over positions), ROW threads striding over C,
             max and sum combined by a shared-memory tree reduction (``_reduce.block_reduce``:
             log2(ROW) steps, a ``syncthreads`` each): for inner == 1 a warp reads 32
             consecutive scores.
  v3_auto    v2 when inner == 1 (classification), v1 otherwise.  The default.
  (the loss kernels: one version each; thread per position, block-reduced partial sums.)

"""

import math

import numpy as np
from numba import cuda

from .. import _versions
from ..softmax import FLT_MIN, REFERENCES, _bad_label_message, softmax_row  # noqa: F401  (references for the tests)
from ._reduce import block_reduce

_softmax_row_dev = cuda.jit(device=True)(softmax_row)

__all__ = [
    "softmax_fwd",
    "softmax_bwd",
    "softmax_loss_fwd",
    "softmax_loss_bwd",
    "softmax_xent_fwd",
    "softmax_xent_fwd_device",
    "VERSIONS",
    "DEFAULTS",
    "use",
    "make_block_kernels",
    "make_loss_kernels",
]


# -- v1: a thread per position -------------------------------------------------------------------
@cuda.jit
def _fwd_thread(x, y):
    """Thread t (grid-stride) -> position (o, k) = divmod(t, inner); the row's work is the CPU
    versions' own ``softmax_row`` (kernels/softmax.py), compiled as a device function."""
    outer, C, inner = x.shape
    t = cuda.grid(1)
    while t < outer * inner:
        o = t // inner
        k = t - o * inner
        _softmax_row_dev(x, y, o, k)
        t += cuda.gridsize(1)


@cuda.jit
def _bwd_thread(y, dy, dx):
    """Thread t (grid-stride) -> position (o, k)."""
    outer, C, inner = y.shape
    t = cuda.grid(1)
    while t < outer * inner:
        o = t // inner
        k = t - o * inner
        d = dx.dtype.type(0)
        for c in range(C):
            d += dy[o, c, k] * y[o, c, k]
        for c in range(C):
            dx[o, c, k] = y[o, c, k] * (dy[o, c, k] - d)
        t += cuda.gridsize(1)


# -- v2: a block per position, shared-memory reduction ------------------------------------------------
_block_cache = {}


def make_block_kernels(ROW):
    """(forward, backward) kernels for blocks of ROW threads (ROW a power of two)."""
    if ROW in _block_cache:
        return _block_cache[ROW]
    if ROW & (ROW - 1):
        raise ValueError(f"softmax: ROW must be a power of two, got {ROW}")

    @cuda.jit
    def fwd_block(x, y):
        """Block b (grid-stride) -> position (o, k); thread tid takes classes tid, tid+ROW, ...;
        max and sum are reduced over the block (``block_reduce``)."""
        red = cuda.shared.array(ROW, dtype=y.dtype)
        outer, C, inner = x.shape
        tid = cuda.threadIdx.x
        for pos in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
            o = pos // inner
            k = pos - o * inner
            m = x[o, 0, k]
            for c in range(tid, C, ROW):
                if x[o, c, k] > m:
                    m = x[o, c, k]
            m = block_reduce(red, m, True)
            acc = y.dtype.type(0)
            for c in range(tid, C, ROW):
                e = math.exp(x[o, c, k] - m)
                y[o, c, k] = e
                acc += e
            r = 1 / block_reduce(red, acc, False)
            for c in range(tid, C, ROW):
                y[o, c, k] *= r

    @cuda.jit
    def bwd_block(y, dy, dx):
        """Block b (grid-stride) -> position (o, k); the dot product sum_c dy*y reduced over
        the block (``block_reduce``)."""
        red = cuda.shared.array(ROW, dtype=dx.dtype)
        outer, C, inner = y.shape
        tid = cuda.threadIdx.x
        for pos in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
            o = pos // inner
            k = pos - o * inner
            acc = dx.dtype.type(0)
            for c in range(tid, C, ROW):
                acc += dy[o, c, k] * y[o, c, k]
            d = block_reduce(red, acc, False)
            for c in range(tid, C, ROW):
                dx[o, c, k] = y[o, c, k] * (dy[o, c, k] - d)

    _block_cache[ROW] = (fwd_block, bwd_block)
    return fwd_block, bwd_block


# -- the loss ------------------------------------------------------------------------------------------
@cuda.jit(device=True)
def _label_at(label, o, k, C, ignore_label, has_ignore):
    """-1: ignored; -2: bad; else the class index (truncated, as Caffe's static_cast<int>)."""
    v = label[o, k]
    if not (v > -4.0e18 and v < 4.0e18):  # NaN, inf, absurd
        return -2
    li = int(v)
    if has_ignore and li == ignore_label:
        return -1
    if li < 0 or li >= C:
        return -2
    return li


_loss_cache = {}
# the fused loss forward runs as one block (one launch, no atomics) up to the launcher's
# ``config.loss_one_block`` positions (outer * inner: a classification batch); beyond, as many
# blocks with a zeroed status and a finishing launch (three launches)


@cuda.jit(device=True)
def _finish_dev(total, count, bad, normalizer, status, loss):
    """status = [total, count, bad, n]; loss[0] = total / n, NaN if a label was bad; n = the
    normalizer, or (normalizer <= 0: Caffe's VALID) the count of labelled positions, at least 1."""
    n = normalizer if normalizer > 0 else (count if count > 1.0 else 1.0)
    status[0] = total
    status[1] = count
    status[2] = bad
    status[3] = n
    if bad != math.inf:
        loss[0] = math.nan
    else:
        loss[0] = total / n


@cuda.jit
def _status_init(status):
    """status = [0, 0, inf, 0] (the multi-block loss accumulates into it with atomics)."""
    i = cuda.grid(1)
    if i < status.size:
        status[i] = math.inf if i == 2 else 0.0


@cuda.jit
def _status_finish(status, normalizer, loss):
    if cuda.grid(1) == 0:
        _finish_dev(status[0], status[1], status[2], normalizer, status, loss)


def make_loss_kernels(T):
    """(loss forward, fused softmax + cross-entropy forward) for blocks of T threads (a power of
    two): per-thread float64 partials, a shared-memory tree sum per block, one atomic per block."""
    if T in _loss_cache:
        return _loss_cache[T]
    if T & (T - 1):
        raise ValueError(f"softmax loss: block size must be a power of two, got {T}")

    @cuda.jit(device=True)
    def block_add(red, loss, count, out):
        """Sum (loss, count) over the block (red: (T,) float64 shared) and add the block's
        totals into out[0], out[1] with one atomic each."""
        loss = block_reduce(red, loss, False)
        count = block_reduce(red, count, False)
        if cuda.threadIdx.x == 0:
            cuda.atomic.add(out, 0, loss)
            cuda.atomic.add(out, 1, count)

    @cuda.jit
    def loss_fwd(prob, label, ignore_label, has_ignore, out):
        """Thread t (grid-stride) -> position (o, k): -log(max(prob[o, label, k], FLT_MIN)) into
        a per-thread float64 partial; block-reduced; out = [loss, count, first bad position]."""
        outer, C, inner = prob.shape
        red = cuda.shared.array(T, dtype=np.float64)
        loss = 0.0
        count = 0.0
        t = cuda.grid(1)
        while t < outer * inner:
            o = t // inner
            k = t - o * inner
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                cuda.atomic.min(out, 2, float(t))
            elif li >= 0:
                p = float(prob[o, li, k])
                loss -= math.log(p if p > FLT_MIN else FLT_MIN)
                count += 1.0
            t += cuda.gridsize(1)
        block_add(red, loss, count, out)

    @cuda.jit
    def xent_fwd(x, label, ignore_label, has_ignore, prob, out):
        """Fused softmax + cross-entropy.  Thread t (grid-stride) -> position (o, k): the row's
        softmax is the CPU versions' ``softmax_row`` (it returns the max and the sum of exps),
        and the loss at the label is log(sum) - (x[label] - max) -- exact where prob
        underflows -- clamped like Caffe's at -log(FLT_MIN)."""
        outer, C, inner = x.shape
        red = cuda.shared.array(T, dtype=np.float64)
        loss = 0.0
        count = 0.0
        cap = -math.log(FLT_MIN)
        t = cuda.grid(1)
        while t < outer * inner:
            o = t // inner
            k = t - o * inner
            m, s = _softmax_row_dev(x, prob, o, k)
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                cuda.atomic.min(out, 2, float(t))
            elif li >= 0:
                nll = math.log(float(s)) - float(x[o, li, k] - m)
                loss += nll if nll < cap else cap
                count += 1.0
            t += cuda.gridsize(1)
        block_add(red, loss, count, out)

    @cuda.jit
    def xent_one(x, label, ignore_label, has_ignore, normalizer, prob, status, loss):
        """The engine's fused SoftmaxWithLoss forward in ONE launch, for up to ``L.config.loss_one_block``
        positions: one block, thread t -> positions t, t + T, ...; the softmax of each row
        (``softmax_row``), its loss at the label, block-reduced (sum of losses, count, and the
        first bad position as the maximum of its negation); then thread 0 finishes on the device:
        status = [loss sum, count, first bad position or inf, normalizer used] and loss[0] = the
        normalized loss (NaN where a label is bad).  One block: no atomics, nothing to zero first."""
        outer, C, inner = x.shape
        red = cuda.shared.array(T, dtype=np.float64)
        total = 0.0
        count = 0.0
        first_bad = -math.inf  # the maximum of -position
        cap = -math.log(FLT_MIN)
        t = cuda.threadIdx.x
        while t < outer * inner:
            o = t // inner
            k = t - o * inner
            m, s = _softmax_row_dev(x, prob, o, k)
            li = _label_at(label, o, k, C, ignore_label, has_ignore)
            if li == -2:
                if -float(t) > first_bad:
                    first_bad = -float(t)
            elif li >= 0:
                nll = math.log(float(s)) - float(x[o, li, k] - m)
                total += nll if nll < cap else cap
                count += 1.0
            t += cuda.blockDim.x
        total = block_reduce(red, total, False)
        count = block_reduce(red, count, False)
        first_bad = block_reduce(red, first_bad, True)
        if cuda.threadIdx.x == 0:
            _finish_dev(total, count, -first_bad, normalizer, status, loss)

    _loss_cache[T] = (loss_fwd, xent_fwd, xent_one)
    return loss_fwd, xent_fwd


@cuda.jit(device=True)
def _loss_bwd_rows(prob, label, ignore_label, has_ignore, scale, dx):
    """The body of both backward kernels. Thread t (grid-stride) -> element (o, c, k) of dx in
    its flat order (coalesced): scale * (prob - [c == label]), 0 where ignored, NaN where the
    label is bad."""
    outer, C, inner = prob.shape
    t = cuda.grid(1)
    while t < prob.size:
        k = t % inner
        c = (t // inner) % C
        o = t // (inner * C)
        li = _label_at(label, o, k, C, ignore_label, has_ignore)
        if li == -1:
            dx[o, c, k] = 0
        elif li == -2:
            dx[o, c, k] = math.nan
        elif c == li:
            dx[o, c, k] = scale * (prob[o, c, k] - 1)
        else:
            dx[o, c, k] = scale * prob[o, c, k]
        t += cuda.gridsize(1)


@cuda.jit
def _loss_bwd(prob, label, ignore_label, has_ignore, scale, dx):
    """dx = scale * (prob - onehot(label)), the scale given by the host."""
    _loss_bwd_rows(prob, label, ignore_label, has_ignore, scale, dx)


@cuda.jit
def _loss_bwd_dev(prob, label, ignore_label, has_ignore, top_diff, status, dx):
    """_loss_bwd with the scale read on the device: top_diff[0] / status[3] (the loss weight
    over the normalizer the forward used): nothing read by the host between the two."""
    scale = dx.dtype.type(top_diff[0] / status[3])  # the arrays' precision, as _loss_bwd's scalar
    _loss_bwd_rows(prob, label, ignore_label, has_ignore, scale, dx)


# -- wrappers --------------------------------------------------------------------------------------------
def _check3(*arrays):
    for a in arrays:
        if a.ndim != 3 or tuple(a.shape) != tuple(arrays[0].shape):
            raise ValueError(
                f"softmax: arrays must be (outer, C, inner) of one shape, got {[tuple(b.shape) for b in arrays]}"
            )
    return arrays[0].shape


def _as_label(prob, label):
    outer, C, inner = prob.shape
    if label.size != outer * inner:
        raise ValueError(
            f"softmax loss: label has {label.size} elements, prob {tuple(prob.shape)} "
            f"needs outer*inner = {outer * inner}"
        )
    return label.reshape(outer, inner)


def softmax_fwd_v1_thread(L, x, y):
    outer, C, inner = _check3(x, y)
    if x.size:
        L.launch1d(_fwd_thread, outer * inner, x, y)


def softmax_bwd_v1_thread(L, y, dy, dx):
    outer, C, inner = _check3(y, dy, dx)
    if y.size:
        L.launch1d(_bwd_thread, outer * inner, y, dy, dx)


def softmax_fwd_v2_block(L, x, y):
    outer, C, inner = _check3(x, y)
    R = L.config.row_threads
    if x.size:
        L.launch1d(make_block_kernels(R)[0], outer * inner, x, y, per_block=1, block=R)


def softmax_bwd_v2_block(L, y, dy, dx):
    outer, C, inner = _check3(y, dy, dx)
    R = L.config.row_threads
    if y.size:
        L.launch1d(make_block_kernels(R)[1], outer * inner, y, dy, dx, per_block=1, block=R)


def softmax_fwd_v3_auto(L, x, y):
    (softmax_fwd_v2_block if x.shape[2] == 1 else softmax_fwd_v1_thread)(L, x, y)


def softmax_bwd_v3_auto(L, y, dy, dx):
    (softmax_bwd_v2_block if y.shape[2] == 1 else softmax_bwd_v1_thread)(L, y, dy, dx)


def _finish(L, out, prob, label):
    """The one device->host copy: (loss, count, first bad position)."""
    loss, count, bad = L.to_host(out)
    if bad != np.inf:
        inner = prob.shape[2]
        o, k = divmod(int(bad), inner)
        raise ValueError(_bad_label_message(L.to_host(label[o, k : k + 1])[0].item(), o, k, prob.shape[1]))
    return float(loss), int(count)


def _loss_out(L):
    out = L.xp.zeros(3, dtype=np.float64)
    out[2] = np.inf  # a fill on the device, not a copy
    return out


def softmax_loss_fwd_v1_thread(L, prob, label, ignore_label, has_ignore):
    outer, C, inner = _check3(prob)
    label = _as_label(prob, label)
    out = _loss_out(L)
    T = L.config.row_threads
    if prob.size:
        L.launch1d(
            make_loss_kernels(T)[0],
            outer * inner,
            prob,
            label,
            int(ignore_label),
            bool(has_ignore),
            out,
            per_block=T,
            block=T,
        )
    return _finish(L, out, prob, label)


def softmax_xent_fwd_v1_fused(L, x, label, ignore_label, has_ignore, prob):
    outer, C, inner = _check3(x, prob)
    label = _as_label(prob, label)
    out = _loss_out(L)
    T = L.config.row_threads
    if x.size:
        L.launch1d(
            make_loss_kernels(T)[1],
            outer * inner,
            x,
            label,
            int(ignore_label),
            bool(has_ignore),
            prob,
            out,
            per_block=T,
            block=T,
        )
    return _finish(L, out, prob, label)


def _check_status(status, loss):
    if status.ndim != 1 or status.size != 4 or status.dtype != np.float64:
        raise ValueError(f"softmax loss: status must be 4 float64, got {tuple(status.shape)} {status.dtype}")
    if loss.size != 1:
        raise ValueError(f"softmax loss: loss must hold 1 value, got shape {tuple(loss.shape)}")


def softmax_xent_fwd_device_v1(L, x, label, ignore_label, has_ignore, normalizer, prob, status, loss):
    """The engine's SoftmaxWithLoss forward, all on the device (the backend contract's
    ``softmax_xent_fwd``): prob = softmax(x); status = [loss sum, count, first bad position or
    inf, normalizer used]; loss[0] = the normalized loss (NaN if a label is bad).  One launch up
    to ``L.config.loss_one_block`` positions, three beyond; nothing is copied to the host."""
    outer, C, inner = _check3(x, prob)
    label = _as_label(prob, label)
    _check_status(status, loss)
    loss = loss.reshape(1)
    T = L.config.row_threads
    n = outer * inner
    norm = float(normalizer)
    if n <= L.config.loss_one_block:
        make_loss_kernels(T)
        xent_one = _loss_cache[T][2]
        L.launch(xent_one, 1, T, x, label, int(ignore_label), bool(has_ignore), norm, prob, status, loss)
        return
    L.launch(_status_init, 1, 4, status)
    L.launch1d(
        make_loss_kernels(T)[1], n, x, label, int(ignore_label), bool(has_ignore), prob, status, per_block=T, block=T
    )
    L.launch(_status_finish, 1, 1, status, norm, loss)


def softmax_loss_bwd_v1_thread(L, prob, label, ignore_label, has_ignore, scale, dx):
    outer, C, inner = _check3(prob, dx)
    label = _as_label(prob, label)
    if isinstance(scale, tuple):  # (top diff, status) on the device: the scale is read there
        top_diff, status = scale
        if prob.size:
            L.launch1d(
                _loss_bwd_dev,
                prob.size,
                prob,
                label,
                int(ignore_label),
                bool(has_ignore),
                top_diff.reshape(1),
                status,
                dx,
            )
        return
    if prob.size:
        L.launch1d(
            _loss_bwd,
            prob.size,
            prob,
            label,
            int(ignore_label),
            bool(has_ignore),
            L.scalar(scale, dx.dtype),
            dx,
        )


VERSIONS = {
    "softmax_fwd": {
        "v1_thread": softmax_fwd_v1_thread,
        "v2_block": softmax_fwd_v2_block,
        "v3_auto": softmax_fwd_v3_auto,
    },
    "softmax_bwd": {
        "v1_thread": softmax_bwd_v1_thread,
        "v2_block": softmax_bwd_v2_block,
        "v3_auto": softmax_bwd_v3_auto,
    },
    "softmax_loss_fwd": {"v1_thread": softmax_loss_fwd_v1_thread},
    "softmax_loss_bwd": {"v1_thread": softmax_loss_bwd_v1_thread},
    "softmax_xent_fwd": {"v1_fused": softmax_xent_fwd_v1_fused},
    "softmax_xent_fwd_device": {"v1_fused": softmax_xent_fwd_device_v1},
}
DEFAULTS = {
    "softmax_fwd": "v3_auto",
    "softmax_bwd": "v3_auto",
    "softmax_loss_fwd": "v1_thread",
    "softmax_loss_bwd": "v1_thread",
    "softmax_xent_fwd": "v1_fused",
    "softmax_xent_fwd_device": "v1_fused",
}

softmax_fwd = VERSIONS["softmax_fwd"][DEFAULTS["softmax_fwd"]]
softmax_bwd = VERSIONS["softmax_bwd"][DEFAULTS["softmax_bwd"]]
softmax_loss_fwd = VERSIONS["softmax_loss_fwd"][DEFAULTS["softmax_loss_fwd"]]
softmax_loss_bwd = VERSIONS["softmax_loss_bwd"][DEFAULTS["softmax_loss_bwd"]]
softmax_xent_fwd = VERSIONS["softmax_xent_fwd"][DEFAULTS["softmax_xent_fwd"]]
softmax_xent_fwd_device = VERSIONS["softmax_xent_fwd_device"][DEFAULTS["softmax_xent_fwd_device"]]


def use(version):
    """Bind every softmax kernel that has ``version`` to it (or "default")."""
    _versions.rebind(globals(), VERSIONS, DEFAULTS, version)


if __name__ == "__main__":  # python -m kernels.cuda.softmax: check, then time, on a GPU (kernels/cuda/bench.py)
    import sys

    from kernels.cuda.bench import main

    sys.exit(main(["--family", "softmax"] + sys.argv[1:]))
