"""The SGD step (decay + momentum + update, sgd_step(w, g, h, momentum, local_rate, decay)): every version against the float64 reference (Caffe's rule), both
dtypes, odd sizes and sizes across the prange chunk; g is left untouched."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, eps, tiny, versions

from kernels import sgd as K

SETTINGS = settings(max_examples=15, deadline=None)


@SETTINGS
@given(
    st.sampled_from([0, 1, 7, 33, 16384 + 5]),
    st.sampled_from([0.01, 0.5]),
    st.sampled_from([0.0, 0.9]),
    st.sampled_from([0.0, 5e-4]),
    st.integers(0, 2**32 - 1),
)
def test_every_version(n, lr, momentum, wd, seed):
    rng = np.random.default_rng(seed)
    w64, g64, h64 = (rng.standard_normal(n) for _ in range(3))
    for dtype in DTYPES:
        w0, g0, h0 = (a.astype(dtype) for a in (w64, g64, h64))
        w_ref, h_ref = K.sgd_step_reference(w0, g0, h0, momentum, lr, wd)
        Wa, Ga, Ha = (np.abs(a.astype(np.float64)) for a in (w0, g0, h0))
        h_mag = momentum * Ha + lr * (Ga + wd * Wa)
        for ver, fn in versions(K, "sgd_step"):
            w, g, h = w0.copy(), g0.copy(), h0.copy()
            fn(w, g, h, momentum, lr, wd)
            desc = f"n={n} lr={lr} momentum={momentum} wd={wd}"
            assert_close(h, h_ref, 6 * eps(dtype) * h_mag + tiny(dtype), kernel="sgd(h)", version=ver, shape=desc)
            assert_close(
                w, w_ref, 8 * eps(dtype) * (Wa + h_mag) + tiny(dtype), kernel="sgd(w)", version=ver, shape=desc
            )
            assert np.array_equal(g, g0), f"sgd_step[{ver}] modified g"


def test_two_steps_by_hand():
    for ver, fn in versions(K, "sgd_step"):
        w = np.array([1.0, -2.0], np.float32)
        g = np.array([0.5, 0.5], np.float32)
        h = np.zeros(2, np.float32)
        fn(w, g, h, 0.9, 0.1, 0.0)  # h = 0.05, w = 0.95, -2.05
        fn(w, g, h, 0.9, 0.1, 0.0)  # h = 0.045 + 0.05 = 0.095, w = 0.855, -2.145
        assert np.allclose(h, [0.095, 0.095]) and np.allclose(w, [0.855, -2.145]), f"sgd_step[{ver}]: w={w} h={h}"
