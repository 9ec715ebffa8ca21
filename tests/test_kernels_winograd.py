"""Winograd convolution (kernels/winograd.py): the transforms derived from their points, the
float64 algorithm against the direct references, and the compiled kernels (forward, data and
weight gradients) against them on odd geometry (padding, partial edge tiles, one image, one
channel), in float32 with the rounding bound ``winograd.reference(..., magnitude=True)`` gives
and in float64; the measured float32 error on LeNet's conv2; clear errors for what it does not do."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import assert_close, eps

from kernels import conv as K
from kernels import winograd as WG

CASES = [(2, 3), (4, 3), (2, 5), (4, 5)]  # (m, r): F(m x m, r x r)


@pytest.mark.parametrize("m,r", CASES)
def test_one_dimension_is_the_correlation(m, r):
    """y = A^T [(G g) * (B^T d)] is the correlation of d with g, exactly (float64 rounding)."""
    AT, G, BT = WG.transforms(m, r)
    rng = np.random.default_rng(m * 10 + r)
    for _ in range(5):
        g, d = rng.standard_normal(r), rng.standard_normal(m + r - 1)
        y = AT @ ((G @ g) * (BT @ d))
        np.testing.assert_allclose(y, [g @ d[i : i + r] for i in range(m)], rtol=0, atol=1e-13)


def test_f2x3_is_lavin_and_grays_table():
    """Up to the sign each point's scale takes, F(2, 3) is Lavin & Gray's Table 1; and the data's
    transforms hold small exact values (the fractions are in G)."""
    AT, G, BT = WG.transforms(2, 3)
    np.testing.assert_array_equal(np.abs(BT), [[1, 0, 1, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 1]])
    np.testing.assert_array_equal(np.abs(G), [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0, 0, 1]])
    np.testing.assert_array_equal(np.abs(AT), [[1, 1, 1, 0], [0, 1, 1, 1]])
    for m, r in CASES:
        BT = WG.transforms(m, r)[2]
        np.testing.assert_array_equal(BT * 4, np.round(BT * 4))  # quarters at most (points +-1/2)


def _run_all(x, w, bias, p, m, dy):
    N, C, H, W = x.shape
    M, _, r, _ = w.shape
    y = np.full((N, M, H + 2 * p - r + 1, W + 2 * p - r + 1), np.nan, x.dtype)
    keep = np.full(WG.tiles_size(x.shape, w.shape, p, p, m), np.nan, x.dtype)
    WG.fwd(x, w, bias, p, p, y, m, keep=keep)
    dx, dw = np.full(x.shape, np.nan, x.dtype), np.full(w.shape, np.nan, x.dtype)
    WG.bwd(x.shape, dy, w, p, p, dx, dw, m, kept=keep)
    return y, dx, dw


@st.composite
def geometry(draw):
    m, r = draw(st.sampled_from(CASES))
    p = draw(st.integers(0, r - 1))
    H = draw(st.integers(max(1, r - 2 * p), 13))
    W = draw(st.integers(max(1, r - 2 * p), 13))
    return m, r, p, (draw(st.integers(1, 3)), draw(st.integers(1, 6)), H, W), draw(st.integers(1, 6))


@settings(max_examples=25, deadline=None)
@given(geometry(), st.integers(0, 2**32 - 1), st.booleans())
def test_kernels_against_the_direct_references(geo, seed, has_bias):
    """fwd, bwd (dx and dw, V kept by fwd) on random geometry: float64 to 1e-10 relative; float32
    within the rounding bound of the algorithm (roundings x eps x the absolute-value run)."""
    m, r, p, xs, M = geo
    rng = np.random.default_rng(seed)
    x64, w64 = rng.standard_normal(xs), rng.standard_normal((M, xs[1], r, r))
    b64 = rng.standard_normal(M) if has_bias else np.zeros(0)
    dy64 = rng.standard_normal((xs[0], M, xs[2] + 2 * p - r + 1, xs[3] + 2 * p - r + 1))
    refs = (
        K.conv_fwd_reference(x64, w64, b64, p, p, 1, 1, 1, 1),
        K.conv_bwd_data_reference(dy64, w64, p, p, 1, 1, 1, 1, xs),
        K.conv_bwd_filter_reference(x64, dy64, p, p, 1, 1, 1, 1, w64.shape),
    )
    mags = list(WG.reference(x64, w64, p, p, m, dy64, magnitude=True))
    mags[0] = mags[0] + np.abs(b64)[None, :, None, None] if has_bias else mags[0]
    tiles = xs[0] * -(-dy64.shape[2] // m) * -(-dy64.shape[3] // m)
    n = WG.roundings(xs[1], M, tiles, m, r)
    for dtype in (np.float32, np.float64):
        got = _run_all(*(v.astype(dtype) for v in (x64, w64, b64)), p, m, dy64.astype(dtype))
        # float64 inputs rounded to float32 are part of the error: one more rounding per term
        for name, g, ref, mag in zip(("fwd", "bwd dx", "bwd dw"), got, refs, mags):
            assert_close(
                g,
                ref,
                (n + 2) * eps(dtype) * mag + 1e-30,
                kernel="winograd." + name,
                version=f"F({m},{r})",
                shape=f"x{xs} M={M} pad={p}",
            )


def test_float64_algorithm_is_the_convolution():
    """``reference`` (the algorithm in float64, the bound's twin) equals the direct sums."""
    rng = np.random.default_rng(3)
    x, w, dy = rng.standard_normal((2, 3, 9, 7)), rng.standard_normal((4, 3, 5, 5)), rng.standard_normal((2, 4, 7, 5))
    y, dx, dw = WG.reference(x, w, 1, 1, 4, dy)
    np.testing.assert_allclose(y, K.conv_fwd_reference(x, w, np.zeros(0), 1, 1, 1, 1, 1, 1), atol=1e-11)
    np.testing.assert_allclose(dx, K.conv_bwd_data_reference(dy, w, 1, 1, 1, 1, 1, 1, x.shape), atol=1e-11)
    np.testing.assert_allclose(dw, K.conv_bwd_filter_reference(x, dy, 1, 1, 1, 1, 1, 1, w.shape), atol=1e-11)


def test_lenet_conv2_float32_error():
    """The measured error on LeNet's conv2 (20 -> 50 channels, 12x12 -> 8x8, one lane's 32
    images): a few 1e-6 of the largest value (direct float32 sums: ~2e-7).  Asserted at 2e-5."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 20, 12, 12)).astype(np.float32)
    w = (rng.standard_normal((50, 20, 5, 5)) * 0.06).astype(np.float32)
    b = rng.standard_normal(50).astype(np.float32)
    dy = rng.standard_normal((32, 50, 8, 8)).astype(np.float32)
    y, dx, dw = _run_all(x, w, b, 0, 4, dy)
    refs = (
        K.conv_fwd_reference(x, w, b, 0, 0, 1, 1, 1, 1),
        K.conv_bwd_data_reference(dy, w, 0, 0, 1, 1, 1, 1, x.shape),
        K.conv_bwd_filter_reference(x, dy, 0, 0, 1, 1, 1, 1, w.shape),
    )
    for got, ref in zip((y, dx, dw), refs):
        assert np.abs(got - ref).max() / np.abs(ref).max() < 2e-5


def test_kept_tiles_and_recomputed_tiles_agree_bit_for_bit():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 11, 10)).astype(np.float32)
    w = rng.standard_normal((6, 4, 5, 5)).astype(np.float32)
    dy = rng.standard_normal((3, 6, 9, 8)).astype(np.float32)
    _, dx, dw = _run_all(x, w, np.zeros(0, np.float32), 1, 4, dy)
    dx2, dw2 = np.empty_like(dx), np.empty_like(dw)
    WG.bwd_data(dy, w, 1, 1, dx2)
    WG.bwd_filter(x, dy, 1, 1, dw2)
    np.testing.assert_array_equal(dx, dx2)
    np.testing.assert_array_equal(dw, dw2)


def test_tile_blocks_cover_every_tile():
    """More tiles than one block (TILE_BLOCK): the blocks' results join up."""
    rng = np.random.default_rng(6)
    N = WG.TILE_BLOCK // 4 + 3  # 4 tiles per image: two blocks, the second partial
    x = rng.standard_normal((N, 2, 12, 12))
    w = rng.standard_normal((3, 2, 5, 5))
    dy = rng.standard_normal((N, 3, 8, 8))
    y, dx, dw = _run_all(x, w, np.zeros(0), 0, 4, dy)
    np.testing.assert_allclose(y, K.conv_fwd_reference(x, w, np.zeros(0), 0, 0, 1, 1, 1, 1), atol=1e-10)
    np.testing.assert_allclose(dx, K.conv_bwd_data_reference(dy, w, 0, 0, 1, 1, 1, 1, x.shape), atol=1e-10)
    np.testing.assert_allclose(dw, K.conv_bwd_filter_reference(x, dy, 0, 0, 1, 1, 1, 1, w.shape), atol=1e-9)


def test_unsupported_geometry():
    x = np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(ValueError, match=r"F\(4x4, 4x4\) is not supported"):
        WG.fwd(x, np.zeros((3, 2, 4, 4), np.float32), np.zeros(0, np.float32), 0, 0, np.zeros((1, 3, 5, 5), np.float32))
    with pytest.raises(ValueError, match="do not give y"):
        WG.fwd(x, np.zeros((3, 2, 3, 3), np.float32), np.zeros(0, np.float32), 0, 0, np.zeros((1, 3, 5, 5), np.float32))
    with pytest.raises(ValueError, match="mixed dtypes"):
        WG.fwd(x, np.zeros((3, 2, 3, 3)), np.zeros(0), 0, 0, np.zeros((1, 3, 6, 6)))
    assert (
        not WG.supported(5, 5, 2, 2, 1, 1) and not WG.supported(5, 5, 1, 1, 2, 2) and not WG.supported(5, 3, 1, 1, 1, 1)
    )
    assert WG.supported(5, 5, 1, 1, 1, 1) and WG.supported(3, 3, 1, 1, 1, 1) and not WG.supported(1, 1, 1, 1, 1, 1)


def test_conv_rung_falls_back_where_winograd_does_not_apply():
    """kernels.conv's v7_winograd runs v3_im2col_blas for a stride-2 or a 4x4 kernel: the same bits."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 11, 11)).astype(np.float32)
    for ws, s in (((4, 3, 5, 5), 2), ((4, 3, 4, 4), 1)):
        w = rng.standard_normal(ws).astype(np.float32)
        OH = (11 + 2 - ws[2]) // s + 1
        y7, y3 = np.empty((2, 4, OH, OH), np.float32), np.empty((2, 4, OH, OH), np.float32)
        K.conv_fwd_v7_winograd(x, w, np.zeros(0, np.float32), 1, 1, s, s, 1, 1, y7)
        K.conv_fwd_v3_im2col_blas(x, w, np.zeros(0, np.float32), 1, 1, s, s, 1, 1, y3)
        np.testing.assert_array_equal(y7, y3)


def test_same_bits():
    from kernels.winograd import same_bits

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    assert same_bits(a, b)
    b[2, 3] = np.nextafter(b[2, 3], np.float32(100))
    assert not same_bits(a, b)
    z, nz = np.zeros(5), np.zeros(5)
    nz[4] = -0.0
    assert not same_bits(z, nz)  # -0.0 == 0.0 as floats, not as bits
    n1 = np.full(3, np.nan, np.float32)
    assert same_bits(n1, n1.copy())  # a NaN is its own bits
    assert not same_bits(a, a.reshape(4, 3)) and not same_bits(a, a.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,r,pad", [((3, 4, 11, 10), 5, 1), ((WG.TILE_BLOCK // 4 + 3, 2, 8, 8), 3, 0)])
def test_compiled_passes_are_the_python_loop_bit_for_bit(monkeypatch, dtype, shape, r, pad):
    """A pass's loop compiled whole (COMPILED_PASSES) computes what the loop in Python does, one
    kernel call at a time (one block or two; kept tiles or x transformed again; beta 0 or 1)."""
    rng = np.random.default_rng(7)
    N, C, H, W = shape
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((3, C, r, r)).astype(dtype)
    bias = rng.standard_normal(3).astype(dtype)
    dy = rng.standard_normal((N, 3, H + 2 * pad - r + 1, W + 2 * pad - r + 1)).astype(dtype)
    dw0 = rng.standard_normal(w.shape).astype(dtype)
    runs = []
    for compiled in (True, False):
        monkeypatch.setattr(WG, "COMPILED_PASSES", compiled)
        y, dx, dw, dw_x = np.empty(dy.shape, dtype), np.empty_like(x), dw0.copy(), np.empty_like(w)
        keep = np.empty(WG.tiles_size(x.shape, w.shape, pad, pad), dtype)
        WG.fwd(x, w, bias, pad, pad, y, keep=keep)
        WG.bwd(x.shape, dy, w, pad, pad, dx=dx, dw=dw, kept=keep, beta=1.0)
        WG.bwd(x.shape, dy, w, pad, pad, dw=dw_x, x=x)
        runs.append((y, dx, dw, dw_x))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
