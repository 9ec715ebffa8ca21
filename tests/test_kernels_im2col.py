"""im2col / col2im: every version against the float64 reference on random geometry (odd and
prime sizes, size 1, padding >= kernel/2, stride > kernel, dilation), both dtypes; a naive
direct convolution checks that W @ im2col(x) is a convolution; col2im is im2col's adjoint."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, assert_equal, sum_tol, versions

from kernels import im2col as K

SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def geometry(draw):
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 6)), draw(st.integers(1, 6))  # stride > kernel too
    ph, pw = draw(st.integers(0, kh + 1)), draw(st.integers(0, kw + 1))  # pad >= kernel/2 too
    N, C = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H = max(draw(st.sampled_from([1, 2, 3, 5, 7, 11, 13])), dh * (kh - 1) + 1 - 2 * ph)
    W = max(draw(st.sampled_from([1, 2, 3, 5, 7, 11, 13])), dw * (kw - 1) + 1 - 2 * pw)
    return (N, C, H, W), (kh, kw, ph, pw, sh, sw, dh, dw)


def _col_shape(xshape, g):
    N, C, H, W = xshape
    kh, kw, ph, pw, sh, sw, dh, dw = g
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    return (C * kh * kw, N * OH * OW)


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_im2col_every_version(geo, seed):
    xshape, g = geo
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal(xshape)
    ref = K.im2col_reference(x64, *g)
    for dtype in DTYPES:
        x = x64.astype(dtype)
        for ver, fn in versions(K, "im2col"):
            col = np.full(_col_shape(xshape, g), np.nan, dtype)
            fn(x, *g, col)
            assert_equal(col, ref.astype(dtype), kernel="im2col", version=ver, shape=f"x{xshape} k,p,s,d={g}")


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_col2im_every_version(geo, seed):
    xshape, g = geo
    kh, kw = g[0], g[1]
    rng = np.random.default_rng(seed)
    col64 = rng.standard_normal(_col_shape(xshape, g))
    for dtype in DTYPES:
        col = col64.astype(dtype)
        ref = K.col2im_reference(col, *g, xshape)
        mag = K.col2im_reference(np.abs(col), *g, xshape)
        for ver, fn in versions(K, "col2im"):
            x = np.full(xshape, np.nan, dtype)
            fn(col, *g, x)
            assert_close(
                x, ref, sum_tol(dtype, kh * kw, mag), kernel="col2im", version=ver, shape=f"x{xshape} k,p,s,d={g}"
            )


@pytest.mark.parametrize(
    "xshape, g",
    [
        ((3, 4, 12, 12), (5, 5, 0, 0, 1, 1, 1, 1)),  # LeNet conv2's geometry: every tap inside
        ((2, 3, 11, 9), (3, 2, 0, 0, 2, 1, 2, 1)),  # row stride and dilation, unit column stride
        ((2, 2, 7, 7), (3, 3, 1, 0, 1, 1, 1, 1)),  # a row pad: only the middle kernel row inside
    ],
)
def test_taps_wholly_inside_the_image(xshape, g):
    """Taps that lie wholly inside the image at unit column stride take v3's short path (bare
    row copies / additions); random geometry reaches it rarely (it needs sw = 1 and no pad on
    that tap), so these shapes pin it, mixed with padded taps in the last one."""
    rng = np.random.default_rng(7)
    x64 = rng.standard_normal(xshape)
    ref = K.im2col_reference(x64, *g)
    col64 = rng.standard_normal(ref.shape)
    back = K.col2im_reference(col64, *g, xshape)
    mag = K.col2im_reference(np.abs(col64), *g, xshape)
    for dtype in DTYPES:
        for ver, fn in versions(K, "im2col"):
            col = np.full(ref.shape, np.nan, dtype)
            fn(x64.astype(dtype), *g, col)
            assert_equal(col, ref.astype(dtype), kernel="im2col", version=ver, shape=f"x{xshape} k,p,s,d={g}")
        for ver, fn in versions(K, "col2im"):
            x = np.full(xshape, np.nan, dtype)
            fn(col64.astype(dtype), *g, x)
            assert_close(
                x, back, sum_tol(dtype, g[0] * g[1], mag), kernel="col2im", version=ver, shape=f"x{xshape} k,p,s,d={g}"
            )


def _direct_conv(x, w, ph, pw, sh, sw, dh, dw):
    """The convolution by definition, one output at a time (float64)."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    OW = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    y = np.zeros((N, M, OH, OW))
    for n in range(N):
        for m in range(M):
            for oh in range(OH):
                for ow in range(OW):
                    s = 0.0
                    for c in range(C):
                        for i in range(kh):
                            for j in range(kw):
                                h, v = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                                if 0 <= h < H and 0 <= v < W:
                                    s += w[m, c, i, j] * x[n, c, h, v]
                    y[n, m, oh, ow] = s
    return y


@pytest.mark.parametrize(
    "g", [(3, 3, 1, 1, 1, 1, 1, 1), (3, 2, 2, 0, 2, 3, 2, 1), (1, 1, 0, 0, 2, 2, 1, 1), (5, 5, 2, 2, 1, 1, 1, 1)]
)
def test_im2col_is_a_convolution(g):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, g[0], g[1]))
    want = _direct_conv(x, w, *g[2:])
    N, M, OH, OW = want.shape
    for ver, fn in versions(K, "im2col"):
        col = np.empty(_col_shape(x.shape, g))
        fn(x, *g, col)
        got = (w.reshape(M, -1) @ col).reshape(M, N, OH, OW).transpose(1, 0, 2, 3)
        mag = _direct_conv(np.abs(x), np.abs(w), *g[2:])
        assert_close(
            got,
            want,
            sum_tol(np.float64, 3 * g[0] * g[1], mag),
            kernel="im2col",
            version=ver,
            shape=f"conv of x{x.shape} w{w.shape} g={g}",
        )


@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_col2im_is_the_adjoint_of_im2col(geo, seed):
    """<im2col(x), c> == <x, col2im(c)> for the default versions."""
    xshape, g = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xshape)
    c = rng.standard_normal(_col_shape(xshape, g))
    col = np.empty_like(c)
    K.im2col(x, *g, col)
    back = np.empty_like(x)
    K.col2im(c, *g, back)
    lhs, rhs = float((col * c).sum()), float((x * back).sum())
    tol = sum_tol(np.float64, c.size, float(np.abs(col * c).sum()))
    assert abs(lhs - rhs) <= tol, f"adjoint: <im2col(x), c> = {lhs!r}, <x, col2im(c)> = {rhs!r}"


def test_bad_col_shape_raises():
    x = np.zeros((1, 1, 5, 5), np.float32)
    col = np.zeros((9, 10), np.float32)  # should be (9, 9)
    for ver, fn in versions(K, "im2col"):
        with pytest.raises(ValueError, match="col must have shape"):
            fn(x, 3, 3, 0, 0, 1, 1, 1, 1, col)


# -- the transposed layout: col handed over as rows.T (one row per output pixel) --------------------
@SETTINGS
@given(geometry(), st.integers(0, 2**32 - 1))
def test_rows_layout_matches_the_reference(geo, seed):
    """im2col into rows.T writes rows = col^T exactly; col2im from rows.T sums like col2im does
    (patches inside the image take the unrolled copy, those reaching into the padding the
    checked loop: the geometry draws both)."""
    xshape, g = geo
    kh, kw = g[0], g[1]
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal(xshape)
    ref = K.im2col_reference(x64, *g)
    c64 = rng.standard_normal(ref.shape)
    for dtype in DTYPES:
        rows = np.full(ref.shape[::-1], np.nan, dtype)
        K.im2col(x64.astype(dtype), *g, rows.T)
        assert_equal(rows.T, ref.astype(dtype), kernel="im2row", version="default", shape=f"x{xshape} g={g}")
        crows = np.ascontiguousarray(c64.T.astype(dtype))
        x = np.full(xshape, np.nan, dtype)
        K.col2im(crows.T, *g, x)
        back = K.col2im_reference(crows.T, *g, xshape)
        mag = K.col2im_reference(np.abs(crows.T), *g, xshape)
        assert_close(x, back, sum_tol(dtype, kh * kw, mag), kernel="row2im", version="default", shape=f"x{xshape}")


def test_every_version_takes_the_rows_layout():
    """Each version, handed rows.T, fills rows (the transposed layout) rather than treating the
    view as a strided col; and each col2im version reads it back the same way."""
    rng = np.random.default_rng(5)
    g = (3, 2, 1, 0, 2, 1, 1, 2)  # pad, stride 2 and a dilated width: both paths of the kernel
    x = rng.standard_normal((2, 3, 7, 6))
    ref = K.im2col_reference(x, *g)
    for ver, fn in versions(K, "im2col"):
        rows = np.full(ref.shape[::-1], np.nan)
        fn(x, *g, rows.T)
        assert_equal(rows, ref.T, kernel="im2col", version=ver, shape="rows layout")
    crows = rng.standard_normal(ref.shape[::-1])
    want = K.col2im_reference(crows.T, *g, x.shape)
    for ver, fn in versions(K, "col2im"):
        back = np.full(x.shape, np.nan)
        fn(crows.T, *g, back)
        assert_close(back, want, 1e-12, kernel="col2im", version=ver, shape="rows layout")


def test_bad_rows_shape_raises():
    x = np.zeros((1, 1, 5, 5), np.float32)
    rows = np.zeros((10, 9), np.float32)  # should be (9, 9)
    with pytest.raises(ValueError, match="rows must be"):
        K.im2col(x, 3, 3, 0, 0, 1, 1, 1, 1, rows.T)
    with pytest.raises(ValueError, match="rows must be"):
        K.col2im(rows.T, 3, 3, 0, 0, 1, 1, 1, 1, x)
