"""Pooling: every version against the float64 reference on random geometry, both dtypes;
Caffe's mask semantics (index within the plane, ties to the first in scan order), the average
divisor at the padded border (hand-computed), windows clipped to the image."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, assert_equal, sum_tol, versions

from kernels import pooling as K

SETTINGS = settings(max_examples=30, deadline=None)


def pooled(size, k, s, p):
    """Caffe's pooled size: ceil rounding, the last window must start inside the padded image."""
    o = -(-(size + 2 * p - k) // s) + 1
    if p > 0 and (o - 1) * s >= size + p:
        o -= 1
    return o


@st.composite
def geometry(draw):
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 6)), draw(st.integers(1, 6))  # stride > kernel too
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))  # Caffe: pad < kernel
    N, C = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H = max(draw(st.sampled_from([1, 2, 3, 4, 5, 7, 11, 13])), kh - 2 * ph)
    W = max(draw(st.sampled_from([1, 2, 3, 4, 5, 7, 11, 13])), kw - 2 * pw)
    ties = draw(st.booleans())
    return (N, C, H, W), (kh, kw, sh, sw, ph, pw), ties


def _input(rng, shape, ties):
    # small integers make ties common (the mask must pick the first); normals elsewhere
    return rng.integers(-2, 3, shape).astype(np.float64) if ties else rng.standard_normal(shape)


def _out_shape(xshape, g):
    N, C, H, W = xshape
    kh, kw, sh, sw, ph, pw = g
    return (N, C, pooled(H, kh, sh, ph), pooled(W, kw, sw, pw))


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_max_pool_every_version(geo, seed):
    xshape, g, ties = geo
    rng = np.random.default_rng(seed)
    x64 = _input(rng, xshape, ties)
    yshape = _out_shape(xshape, g)
    dy64 = rng.standard_normal(yshape)
    desc = f"x{xshape} k,s,p={g} ties={ties}"
    for dtype in DTYPES:
        x, dy = x64.astype(dtype), dy64.astype(dtype)
        y_ref, m_ref = K.max_pool_fwd_reference(x, *g, *yshape[2:])
        for ver, fn in versions(K, "max_pool_fwd"):
            y = np.full(yshape, np.nan, dtype)
            mask = np.full(yshape, -7, np.int32)
            fn(x, *g, y, mask)
            assert_equal(mask, m_ref, kernel="max_pool_fwd(mask)", version=ver, shape=desc)
            assert_equal(y, y_ref.astype(dtype), kernel="max_pool_fwd", version=ver, shape=desc)
        dx_ref = K.max_pool_bwd_reference(dy, m_ref, xshape)
        mag = K.max_pool_bwd_reference(np.abs(dy), m_ref, xshape)
        for ver, fn in versions(K, "max_pool_bwd"):
            dx = np.full(xshape, np.nan, dtype)
            fn(dy, m_ref, *g, dx)
            assert_close(dx, dx_ref, sum_tol(dtype, g[0] * g[1], mag), kernel="max_pool_bwd", version=ver, shape=desc)


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_ave_pool_every_version(geo, seed):
    xshape, g, ties = geo
    kh, kw = g[0], g[1]
    rng = np.random.default_rng(seed)
    x64 = _input(rng, xshape, ties)
    yshape = _out_shape(xshape, g)
    dy64 = rng.standard_normal(yshape)
    desc = f"x{xshape} k,s,p={g}"
    for dtype in DTYPES:
        x, dy = x64.astype(dtype), dy64.astype(dtype)
        y_ref = K.ave_pool_fwd_reference(x, *g, *yshape[2:])
        mag = K.ave_pool_fwd_reference(np.abs(x), *g, *yshape[2:])
        for ver, fn in versions(K, "ave_pool_fwd"):
            y = np.full(yshape, np.nan, dtype)
            fn(x, *g, y)
            assert_close(y, y_ref, sum_tol(dtype, kh * kw, mag), kernel="ave_pool_fwd", version=ver, shape=desc)
        dx_ref = K.ave_pool_bwd_reference(dy, *g, xshape)
        mag = K.ave_pool_bwd_reference(np.abs(dy), *g, xshape)
        for ver, fn in versions(K, "ave_pool_bwd"):
            dx = np.full(xshape, np.nan, dtype)
            fn(dy, *g, dx)
            assert_close(dx, dx_ref, sum_tol(dtype, kh * kw, mag), kernel="ave_pool_bwd", version=ver, shape=desc)


def test_max_pool_ties_go_to_the_first_in_scan_order():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 0] = x[0, 0, 0, 1] = 5  # same max twice in window (0, 0): (0,1) is first
    x[0, 0, 3, 3] = x[0, 0, 3, 2] = x[0, 0, 2, 3] = -1  # window (1, 1): all zero but these
    for ver, fn in versions(K, "max_pool_fwd"):
        y = np.empty((1, 1, 2, 2), np.float32)
        mask = np.empty((1, 1, 2, 2), np.int32)
        fn(x, 2, 2, 2, 2, 0, 0, y, mask)
        assert mask[0, 0].tolist() == [[1, 2], [8, 10]], f"max_pool_fwd[{ver}] mask {mask}"
        assert y[0, 0].tolist() == [[5, 0], [0, 0]], f"max_pool_fwd[{ver}] y {y}"


def test_max_pool_mask_is_within_the_plane():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 5))
    for ver, fn in versions(K, "max_pool_fwd"):
        y = np.empty((2, 3, 2, 2))
        mask = np.empty((2, 3, 2, 2), np.int32)
        fn(x, 3, 3, 2, 2, 0, 0, y, mask)
        assert mask.min() >= 0 and mask.max() < 25, f"max_pool_fwd[{ver}]: {mask}"
        assert np.array_equal(
            x.reshape(2, 3, 25)[np.arange(2)[:, None, None], np.arange(3)[None, :, None], mask.reshape(2, 3, 4)],
            y.reshape(2, 3, 4),
        )


def test_max_pool_backward_ignores_a_mask_index_outside_the_plane():
    """A mask that is not the forward's (scratch memory read by mistake: huge or one-past-the-end
    indices) adds nothing outside the plane: every version matches the reference, which counts
    only indices in [0, H*W), and the planes next to the bad one are untouched."""
    rng = np.random.default_rng(5)
    dy = rng.standard_normal((2, 3, 2, 2))
    mask = rng.integers(0, 25, size=(2, 3, 2, 2)).astype(np.int32)
    mask[0, 1, 0, 0] = 25  # one past the plane: would land in plane (0, 2)
    mask[1, 2, 1, 1] = 1 << 30  # far outside the whole array
    mask[1, 0, 0, 1] = -1  # a window in the padding
    ref = K.max_pool_bwd_reference(dy, mask, (2, 3, 5, 5))
    assert ref[0, 2].reshape(-1)[0] == (dy[0, 2].reshape(-1)[mask[0, 2].reshape(-1) == 0]).sum()
    for ver, fn in versions(K, "max_pool_bwd"):
        dx = np.full((2, 3, 5, 5), np.nan)
        fn(dy, mask, 3, 3, 2, 2, 0, 0, dx)
        assert np.allclose(dx, ref, rtol=0, atol=1e-12), f"max_pool_bwd[{ver}] with indices outside the plane"


def test_ave_pool_divisor_at_the_padded_border():
    """4x4 ones, 3x3 window, stride 2, pad 1 -> 3x3 outputs.  Window (0, 0) covers padded
    rows/cols -1..1: 4 ones / 9.  Window (2, 2) starts at 3: rows 3..5 clipped to the padded
    image (< H + pad = 5) -> 2x2 = 4 cells, 1 of them inside: 1/4.  Window (0, 2): 2 rows x 1
    col inside, divisor 3 x 2 = 6."""
    x = np.ones((1, 1, 4, 4))
    want = np.array([[4 / 9, 6 / 9, 2 / 6], [6 / 9, 9 / 9, 3 / 6], [2 / 6, 3 / 6, 1 / 4]])
    for dtype in DTYPES:
        for ver, fn in versions(K, "ave_pool_fwd"):
            y = np.empty((1, 1, 3, 3), dtype)
            fn(x.astype(dtype), 3, 3, 2, 2, 1, 1, y)
            assert_close(
                y[0, 0], want, 4 * np.finfo(dtype).eps, kernel="ave_pool_fwd", version=ver, shape="4x4 ones k3 s2 p1"
            )
        for ver, fn in versions(K, "ave_pool_bwd"):
            dx = np.empty((1, 1, 4, 4), dtype)
            fn(np.ones((1, 1, 3, 3), dtype), 3, 3, 2, 2, 1, 1, dx)
            # pixel (0, 0) is only in window (0, 0): 1/9; pixel (3, 3) (rows and columns of
            # windows 1 and 2) in (1,1), (1,2), (2,1), (2,2) with divisors 9, 6, 6, 4
            assert abs(dx[0, 0, 0, 0] - 1 / 9) < 1e-6 and abs(dx[0, 0, 3, 3] - (1 / 9 + 2 / 6 + 1 / 4)) < 1e-6, (
                f"ave_pool_bwd[{ver}] {dx[0, 0]}"
            )


@pytest.mark.parametrize("shape", [(64, 20, 24, 24), (3, 5, 9, 7)])
def test_k2s2_fast_path_and_odd_sizes(shape):
    """LeNet's 2x2/2 pool (the v3 fast path) and an odd size (floor: last row unused)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    yshape = shape[:2] + (shape[2] // 2, shape[3] // 2)
    y_ref, m_ref = K.max_pool_fwd_reference(x, 2, 2, 2, 2, 0, 0, *yshape[2:])
    a_ref = K.ave_pool_fwd_reference(x, 2, 2, 2, 2, 0, 0, *yshape[2:])
    a_mag = K.ave_pool_fwd_reference(np.abs(x), 2, 2, 2, 2, 0, 0, *yshape[2:])
    for ver, fn in versions(K, "max_pool_fwd"):
        y, mask = np.empty(yshape, np.float32), np.empty(yshape, np.int32)
        fn(x, 2, 2, 2, 2, 0, 0, y, mask)
        assert_equal(mask, m_ref, kernel="max_pool_fwd(mask)", version=ver, shape=str(shape))
    for ver, fn in versions(K, "ave_pool_fwd"):
        y = np.empty(yshape, np.float32)
        fn(x, 2, 2, 2, 2, 0, 0, y)
        assert_close(y, a_ref, sum_tol(np.float32, 4, a_mag), kernel="ave_pool_fwd", version=ver, shape=str(shape))


@pytest.mark.parametrize("dtype", DTYPES)
def test_k2s2_windows_full_of_ties_keep_the_first_in_scan_order(dtype):
    """Values from {-1, 0, 1}: most 2x2 windows hold their maximum two or more times, so every
    tie-breaking order (v5's selects among them) is exercised against the reference's argmax;
    an exact tiling (v5's fast path) and an odd one (its fallback)."""
    rng = np.random.default_rng(11)
    for shape in ((4, 6, 8, 12), (2, 3, 7, 9)):
        x = rng.integers(-1, 2, shape).astype(dtype)
        yshape = shape[:2] + (shape[2] // 2, shape[3] // 2)
        y_ref, m_ref = K.max_pool_fwd_reference(x, 2, 2, 2, 2, 0, 0, *yshape[2:])
        for ver, fn in versions(K, "max_pool_fwd"):
            y, mask = np.full(yshape, np.nan, dtype), np.full(yshape, -7, np.int32)
            fn(x, 2, 2, 2, 2, 0, 0, y, mask)
            assert_equal(mask, m_ref, kernel="max_pool_fwd(mask)", version=ver, shape=str(shape))
            assert_equal(y, y_ref.astype(dtype), kernel="max_pool_fwd", version=ver, shape=str(shape))
