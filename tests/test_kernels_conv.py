"""Convolution forward as a whole: every version (direct loops, im2col + BLAS, im2col + the
hand-written GEMM) against the float64 reference on random geometry, both dtypes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, sum_tol, versions

from kernels import conv as K

SETTINGS = settings(max_examples=20, deadline=None)


@st.composite
def geometry(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sh, sw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    ph, pw = draw(st.integers(0, kh)), draw(st.integers(0, kw))
    N, C, M = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    H = max(draw(st.sampled_from([1, 3, 5, 8, 11])), dh * (kh - 1) + 1 - 2 * ph)
    W = max(draw(st.sampled_from([1, 3, 5, 8, 11])), dw * (kw - 1) + 1 - 2 * pw)
    return (N, C, H, W), (M, C, kh, kw), (ph, pw, sh, sw, dh, dw), draw(st.booleans())


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_every_version(geo, seed):
    xs, ws, g, has_bias = geo
    rng = np.random.default_rng(seed)
    x64, w64 = rng.standard_normal(xs), rng.standard_normal(ws)
    b64 = rng.standard_normal(ws[0]) if has_bias else np.zeros(0)
    for dtype in DTYPES:
        x, w, b = x64.astype(dtype), w64.astype(dtype), b64.astype(dtype)
        ref = K.conv_fwd_reference(x, w, b, *g)
        mag = K.conv_fwd_reference(np.abs(x), np.abs(w), np.abs(b), *g)
        n_terms = ws[1] * ws[2] * ws[3] + 1
        for ver, fn in versions(K, "conv_fwd"):
            y = np.full(ref.shape, np.nan, dtype)
            fn(x, w, b, *g, y)
            assert_close(
                y,
                ref,
                sum_tol(dtype, n_terms, mag),
                kernel="conv_fwd",
                version=ver,
                shape=f"x{xs} w{ws} p,s,d={g} bias={has_bias}",
            )
