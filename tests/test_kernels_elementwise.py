"""Elementwise activations: every version against the float64 reference, both dtypes, odd
sizes (and sizes that cross the prange chunk), in place (y is x), and the ReLU kink at 0."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, eps, tiny, versions

from kernels import elementwise as K

SETTINGS = settings(max_examples=20, deadline=None)
sizes = st.sampled_from([0, 1, 2, 7, 31, 1000, 16384 + 3])


# which input the output may alias when run in place: y is x, dx is dy
INPLACE = {"relu_fwd": 0, "relu_bwd": 1, "sigmoid_fwd": 0, "sigmoid_bwd": 1, "tanh_fwd": 0, "tanh_bwd": 1}


def _cases(x, dy, slope):
    """(name, inputs, reference, absolute magnitude for the tolerance, roundings)."""
    y_sig = K.sigmoid_fwd_reference(x).astype(x.dtype)
    y_tanh = K.tanh_fwd_reference(x).astype(x.dtype)
    X, D = np.abs(x.astype(np.float64)), np.abs(dy.astype(np.float64))
    return [
        ("relu_fwd", (x, slope), K.relu_fwd_reference(x, slope), X, 1),
        ("relu_bwd", (x, dy, slope), K.relu_bwd_reference(x, dy, slope), D, 1),
        ("sigmoid_fwd", (x,), K.sigmoid_fwd_reference(x), np.abs(K.sigmoid_fwd_reference(x)), 6),
        ("sigmoid_bwd", (y_sig, dy), K.sigmoid_bwd_reference(y_sig, dy), D * np.abs(y_sig) * (1 + np.abs(y_sig)), 3),
        ("tanh_fwd", (x,), K.tanh_fwd_reference(x), np.abs(K.tanh_fwd_reference(x)), 6),
        ("tanh_bwd", (y_tanh, dy), K.tanh_bwd_reference(y_tanh, dy), D * (1 + y_tanh**2), 3),
    ]


@SETTINGS
@given(sizes, st.sampled_from([0.0, 0.1, -0.5]), st.sampled_from([1.0, 30.0]), st.integers(0, 2**32 - 1))
def test_every_version(n, slope, scale, seed):
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal(n) * scale
    if n > 2:
        x64[:2] = 0.0  # the kink: Caffe's x <= 0 side
    dy64 = rng.standard_normal(n)
    for dtype in DTYPES:
        x, dy = x64.astype(dtype), dy64.astype(dtype)
        for name, args, ref, mag, roundings in _cases(x, dy, slope):
            tol = roundings * eps(dtype) * mag + 2 * tiny(dtype)
            for ver, fn in versions(K, name):
                out = np.full(n, np.nan, dtype)
                fn(*args, out)
                assert_close(out, ref, tol, kernel=name, version=ver, shape=f"n={n}")
                args2 = list(args)
                k = INPLACE[name]
                args2[k] = args[k].copy()
                fn(*args2, args2[k])
                assert_close(args2[k], ref, tol, kernel=name, version=ver, shape=f"n={n} in place")


@pytest.mark.parametrize("ver", list(K.VERSIONS["relu_bwd"]))
def test_relu_bwd_is_caffes_formula_at_zero(ver):
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    dy = np.ones(3, np.float32)
    dx = np.empty(3, np.float32)
    K.VERSIONS["relu_bwd"][ver](x, dy, 0.25, dx)
    assert dx.tolist() == [0.25, 0.25, 1.0], f"relu_bwd[{ver}] at x=0 takes the slope: {dx}"
