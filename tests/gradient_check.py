"""A central-difference gradient checker for layers, modelled on Caffe's GradientChecker.

The objective is a fixed random weighting of the checked tops,

    f = sum_t sum(top_t.data * w_t)        (w_t drawn once; for a loss top, a random scalar)

so the analytic gradient is what ``backward`` gives with ``top_t.diff = w_t``.  The numeric
gradient of every element of every checked bottom and parameter blob is

    (f(x + h) - f(x - h)) / 2h

and the two must agree within ``tol * max(|analytic|, |numeric|, 1) + roundoff``, where the
roundoff term ``8 * eps * (|f| + 1) / h`` is what cancellation in f(x+h) - f(x-h) can cost.
Run it in float64: h = 1e-6 makes the truncation error (~h^2) negligible, which float32 cannot.

Kinks (ReLU at 0, max pooling ties, |x| at 0): an element within ``kink_range`` of ``kink`` is
skipped, as Caffe's CheckGradientExhaustive does; better still, tests draw inputs away from
kinks.  The random seed is reset before every forward, so Dropout draws the same mask each time.

Besides the numbers it checks Caffe's rules about state: parameter diffs *accumulate* (a second
backward doubles them) and bottom diffs are *overwritten* (a second backward leaves them equal).
"""

import numpy as np

from minicaffe.rng import set_random_seed

EPS64 = np.finfo(np.float64).eps


class GradientError(AssertionError):
    pass


def _host(layer, a):
    return np.array(layer.backend.to_host(a), dtype=np.float64)


def check_gradient(
    layer,
    bottom,
    top,
    check_bottom=None,
    check_params=True,
    check_tops=None,
    step=1e-6,
    tol=1e-6,
    kink=None,
    kink_range=-1.0,
    seed=1701,
    max_per_blob=None,
    unit_top_weights=False,
):
    """Check ``layer``'s backward against central differences; raise GradientError naming the
    layer, the blob, the flat index, both values and the tolerance on the first mismatch.

    ``layer`` must already be set up with ``bottom``/``top``.  ``check_bottom``: indices of the
    bottoms to check (default: all).  ``check_tops``: indices of the tops in the objective
    (default: all).  ``max_per_blob``: check only that many elements of each blob (spread evenly).
    ``unit_top_weights``: weight the tops by 1 (for a loss layer that, like pycaffe's pyloss
    example, ignores its top diff and so assumes loss weight 1).
    Returns the number of elements checked.
    """
    rng = np.random.default_rng(seed)
    check_bottom = list(range(len(bottom))) if check_bottom is None else list(check_bottom)
    check_tops = list(range(len(top))) if check_tops is None else list(check_tops)
    propagate_down = [i in check_bottom for i in range(len(bottom))]

    def run_forward():
        set_random_seed(seed)
        layer.reshape(bottom, top)
        layer.forward(bottom, top)

    run_forward()
    weights = {
        t: (np.ones(top[t].shape) if unit_top_weights else rng.uniform(-1.0, 1.0, size=top[t].shape))
        for t in check_tops
    }

    def objective():
        run_forward()
        return sum(float((_host(layer, top[t].data) * weights[t]).sum()) for t in check_tops)

    # -- analytic ---------------------------------------------------------------------------------
    def analytic():
        run_forward()
        for i, t in enumerate(top):
            w = weights.get(i)
            t.diff[...] = w if w is not None else 0  # host arrays (pycaffe's idiom)
        for b in bottom:
            b.diff[...] = np.nan  # must be overwritten
        layer.backward(top, propagate_down, bottom)

    params = list(layer.blobs) if check_params else []
    for p in params:
        p.diff[...] = 0
    analytic()
    grads = [("bottom", i, bottom[i], _host(layer, bottom[i].diff).copy()) for i in check_bottom]
    grads += [
        ("param", j, p, _host(layer, p.diff).copy())
        for j, p in enumerate(params)
        if not layer.param_propagate_down or j >= len(layer.param_propagate_down) or layer.param_propagate_down[j]
    ]

    # -- state rules: bottoms overwritten, parameters accumulated ----------------------------------
    analytic()
    for kind, i, blob, g in grads:
        again = _host(layer, blob.diff)
        want = g if kind == "bottom" else 2 * g
        rule = (
            "be overwritten (equal after a second backward)"
            if kind == "bottom"
            else "accumulate (double after a second backward)"
        )
        if not np.allclose(again, want, rtol=1e-9, atol=1e-12, equal_nan=False):
            k = int(np.argmax(np.abs(again - want).ravel()))
            raise GradientError(
                f"{layer.type} '{layer.name}': {kind} {i} diff should {rule}; at flat "
                f"index {k} got {again.ravel()[k]!r}, expected {want.ravel()[k]!r}"
            )

    # -- numeric ----------------------------------------------------------------------------------
    checked = 0
    for kind, i, blob, g in grads:
        if np.isnan(g).any():
            raise GradientError(f"{layer.type} '{layer.name}': backward left {kind} {i} diff unwritten (NaN)")
        n = blob.count
        indices = (
            range(n)
            if max_per_blob is None or n <= max_per_blob
            else np.unique(np.linspace(0, n - 1, max_per_blob).astype(int))
        )
        for k in indices:
            k = int(k)
            # blob.data is asked for at every write: a host array kept across a forward goes
            # stale on a GPU backend (the engine's side becomes the newer; minicaffe/blob.py)
            x0 = float(blob.data.reshape(-1)[k])
            if kink is not None and abs(x0 - kink) < kink_range:
                continue
            blob.data.reshape(-1)[k] = x0 + step
            f_plus = objective()
            blob.data.reshape(-1)[k] = x0 - step
            f_minus = objective()
            blob.data.reshape(-1)[k] = x0
            numeric = (f_plus - f_minus) / (2 * step)
            a = float(g.ravel()[k])
            scale = max(abs(a), abs(numeric), 1.0)
            bound = tol * scale + 8 * EPS64 * (abs(f_plus) + 1.0) / step
            if not abs(a - numeric) <= bound:
                raise GradientError(
                    f"{layer.type} '{layer.name}': {kind} {i} (shape {tuple(blob.shape)}) flat index {k}: "
                    f"analytic {a:.10g} vs numeric {numeric:.10g}, |diff| {abs(a - numeric):.3g} > "
                    f"tolerance {bound:.3g} (step {step:g})"
                )
            checked += 1
    run_forward()
    return checked
