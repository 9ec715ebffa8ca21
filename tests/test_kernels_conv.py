"""Convolution forward, backward-data and backward-filter as a whole: every version (direct loops, im2col +
BLAS, implicit GEMM, serial and per-image parallel) against the float64 references on random geometry and on shapes
that cross the implicit GEMM's blocks, both dtypes; the parallel rung from two threads at once
under the OpenMP threading layer."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, sum_tol, versions

from kernels import conv as K
from kernels import winograd as WG

SETTINGS = settings(max_examples=20, deadline=None)


def _tol(ver, dtype, xs, ws, g, which, tol, x=None, w=None, dy=None, b=None):
    """The test's tolerance for ``ver``: the direct sums' bound, except where v7_winograd runs
    Winograd's algorithm: there the rounding bound of its transforms (kernels/winograd.py,
    ``reference(..., magnitude=True)``, as tests/test_kernels_winograd.py checks it)."""
    ph, pw, sh, sw, dh, dw = g
    if ver != "v7_winograd" or not WG.supported(ws[2], ws[3], sh, sw, dh, dw) or ph != pw:
        return tol
    m = WG.tile_for(ws[2])
    x = np.zeros(xs) if x is None else x
    w = np.zeros(ws) if w is None else w
    mags = list(WG.reference(x, w, ph, pw, m, dy, magnitude=True))
    if b is not None and b.size:
        mags[0] = mags[0] + np.abs(b.astype(np.float64))[None, :, None, None]  # the bias: added last
    OH, OW = xs[2] + 2 * ph - ws[2] + 1, xs[3] + 2 * pw - ws[3] + 1
    n = WG.roundings(xs[1], ws[0], xs[0] * -(-OH // m) * -(-OW // m), m, ws[2]) + 2
    return np.maximum(tol, n * np.finfo(dtype).eps * mags[which])


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
                _tol(ver, dtype, xs, ws, g, 0, sum_tol(dtype, n_terms, mag), x=x, w=w, b=b),
                kernel="conv_fwd",
                version=ver,
                shape=f"x{xs} w{ws} p,s,d={g} bias={has_bias}",
            )


@settings(max_examples=10, deadline=None)
@given(geometry(), st.integers(0, 2**32 - 1))
def test_bwd_data_every_version(geo, seed):
    """The gradient to the input: every version against the tap-by-tap float64 adjoint."""
    xs, ws, g, _ = geo
    rng = np.random.default_rng(seed)
    ph, pw, sh, sw, dh, dw = g
    OH = (xs[2] + 2 * ph - (dh * (ws[2] - 1) + 1)) // sh + 1
    OW = (xs[3] + 2 * pw - (dw * (ws[3] - 1) + 1)) // sw + 1
    dy64, w64 = rng.standard_normal((xs[0], ws[0], OH, OW)), rng.standard_normal(ws)
    for dtype in DTYPES:
        dy, w = dy64.astype(dtype), w64.astype(dtype)
        ref = K.conv_bwd_data_reference(dy, w, *g, xs)
        mag = K.conv_bwd_data_reference(np.abs(dy), np.abs(w), *g, xs)
        for ver, fn in versions(K, "conv_bwd_data"):
            dx = np.full(xs, np.nan, dtype)
            fn(dy, w, *g, dx)
            n_terms = ws[0] * ws[2] * ws[3]
            tol = _tol(ver, dtype, xs, ws, g, 1, sum_tol(dtype, n_terms, mag), w=w, dy=dy)
            assert_close(dx, ref, tol, kernel="conv_bwd_data", version=ver, shape=f"x{xs} w{ws} {g}")


@settings(max_examples=10, deadline=None)
@given(geometry(), st.integers(0, 2**32 - 1))
def test_bwd_filter_every_version(geo, seed):
    """The gradient to the weights: every version against the tap-by-tap float64 reference."""
    xs, ws, g, _ = geo
    rng = np.random.default_rng(seed)
    ph, pw, sh, sw, dh, dw = g
    OH = (xs[2] + 2 * ph - (dh * (ws[2] - 1) + 1)) // sh + 1
    OW = (xs[3] + 2 * pw - (dw * (ws[3] - 1) + 1)) // sw + 1
    x64, dy64 = rng.standard_normal(xs), rng.standard_normal((xs[0], ws[0], OH, OW))
    for dtype in DTYPES:
        x, dy = x64.astype(dtype), dy64.astype(dtype)
        ref = K.conv_bwd_filter_reference(x, dy, *g, ws)
        mag = K.conv_bwd_filter_reference(np.abs(x), np.abs(dy), *g, ws)
        for ver, fn in versions(K, "conv_bwd_filter"):
            out = np.full(ws, np.nan, dtype)
            fn(x, dy, *g, out)
            n_terms = xs[0] * OH * OW
            tol = _tol(ver, dtype, xs, ws, g, 2, sum_tol(dtype, n_terms, mag), x=x, dy=dy)
            assert_close(out, ref, tol, kernel="conv_bwd_filter", version=ver, shape=f"x{xs} w{ws} {g}")


@pytest.mark.parametrize("xs, ws, pad", [((70, 12, 8, 8), (7, 12, 5, 5), 0), ((3, 11, 9, 9), (5, 11, 5, 5), 2)])
def test_implicit_gemm_across_its_blocks(xs, ws, pad):
    """C*kh*kw = 300 and 275 rows of col (two passes of KB = 256) and, for the first shape,
    70 images of 16 output pixels: a block of 64 images and one of 6."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    g = (pad, pad, 1, 1, 1, 1)
    ref = K.conv_fwd_reference(x, w, b, *g)
    mag = K.conv_fwd_reference(np.abs(x), np.abs(w), np.abs(b), *g)
    for ver in ("v4_implicit", "v5_implicit_prange"):
        y = np.full(ref.shape, np.nan, np.float32)
        K.VERSIONS["conv_fwd"][ver](x, w, b, *g, y)
        n_terms = ws[1] * ws[2] * ws[3] + 1
        assert_close(y, ref, sum_tol(np.float32, n_terms, mag), kernel="conv_fwd", version=ver, shape=f"x{xs}")
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    dref = K.conv_bwd_data_reference(dy, w, *g, xs)
    dmag = K.conv_bwd_data_reference(np.abs(dy), np.abs(w), *g, xs)
    dx = np.full(xs, np.nan, np.float32)
    K.VERSIONS["conv_bwd_data"]["v4_implicit"](dy, w, *g, dx)
    n_terms = ws[0] * ws[2] * ws[3]
    assert_close(dx, dref, sum_tol(np.float32, n_terms, dmag), kernel="conv_bwd_data", version="v4_implicit")
    fref = K.conv_bwd_filter_reference(x, dy, *g, ws)
    fmag = K.conv_bwd_filter_reference(np.abs(x), np.abs(dy), *g, ws)
    out = np.full(ws, np.nan, np.float32)
    K.VERSIONS["conv_bwd_filter"]["v4_implicit"](x, dy, *g, out)
    n_terms = dy.shape[0] * dy.shape[2] * dy.shape[3]
    assert_close(out, fref, sum_tol(np.float32, n_terms, fmag), kernel="conv_bwd_filter", version="v4_implicit")


def test_parallel_rung_from_two_threads_under_openmp():
    """numba's OpenMP threading layer lets two Python threads run parallel regions at once (its
    default workqueue layer aborts the process): what per-image parallel kernels inside the
    threaded runtime need.  Skips, saying why, where numba has no OpenMP layer."""
    code = """
        import threading
        import numpy as np
        import numba
        from kernels import conv
        rng = np.random.default_rng(0)
        x = rng.standard_normal((8, 3, 12, 12)).astype(np.float32)
        w = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
        b = np.zeros(4, np.float32)
        ref = conv.conv_fwd_reference(x, w, b, 0, 0, 1, 1, 1, 1)
        f = conv.VERSIONS["conv_fwd"]["v5_implicit_prange"]
        errors = []
        def work():
            for _ in range(20):
                y = np.empty((8, 4, 8, 8), np.float32)
                f(x, w, b, 0, 0, 1, 1, 1, 1, y)
                if not np.allclose(y, ref, rtol=1e-4, atol=1e-4):
                    errors.append("wrong")
        ts = [threading.Thread(target=work) for _ in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        print("LAYER", numba.threading_layer(), "ERRORS", len(errors))
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_THREADING_LAYER="omp", PYTHONPATH=root)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=root, timeout=600
    )
    if r.returncode != 0 and "No threading layer could be loaded" in r.stderr:
        pytest.skip("numba's OpenMP threading layer is not available here (no libgomp)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LAYER omp ERRORS 0" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "xs, ws, g",
    [
        ((2, 3, 32, 32), (6, 3, 5, 5), (2, 2, 1, 1, 1, 1)),  # rows of 1024: y's rows alias, the padded buffer
        ((2, 1, 28, 28), (20, 1, 5, 5), (0, 0, 1, 1, 1, 1)),  # LeNet's conv1: straight into y's rows
        ((2, 2, 13, 11), (7, 2, 3, 4), (1, 2, 3, 2, 2, 1)),  # strides: row phases and sampled columns
    ],
)
def test_shifted_planes_each_path(xs, ws, g):
    """v6 over shifted planes on each of its paths (the forward straight into y's rows or through
    its padded buffer, a last group of M % 4 channels, row phases for a stride) against the float64
    references, with the bias; its weight and bias gradients accumulate into what is there."""
    rng = np.random.default_rng(7)
    x64, w64, b64 = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    ref = K.conv_fwd_reference(x64, w64, b64, *g)
    dy64 = rng.standard_normal(ref.shape)
    fref = K.conv_bwd_filter_reference(x64, dy64, *g, ws)
    for dtype in DTYPES:
        x, w, b, dy = (a.astype(dtype) for a in (x64, w64, b64, dy64))
        y = np.full(ref.shape, np.nan, dtype)
        K.shifted_fwd(x, w, b, *g, y)
        mag = K.conv_fwd_reference(np.abs(x64), np.abs(w64), np.abs(b64), *g)
        assert_close(y, ref, sum_tol(dtype, ws[1] * ws[2] * ws[3] + 1, mag), kernel="conv_fwd", version="v6")
        dwt, db = np.ones(ws, dtype), np.ones(ws[0], dtype)
        K.shifted_bwd_filter(x, dy, *g, dwt, db)
        n = xs[0] * ref.shape[2] * ref.shape[3]
        fmag = K.conv_bwd_filter_reference(np.abs(x64), np.abs(dy64), *g, ws)
        assert_close(dwt, 1 + fref, sum_tol(dtype, n + 1, 1 + fmag), kernel="conv_bwd_filter", version="v6")
        dbref = 1 + dy64.sum(axis=(0, 2, 3))
        assert_close(
            db, dbref, sum_tol(dtype, n + 1, 1 + np.abs(dy64).sum(axis=(0, 2, 3))), kernel="bias", version="v6"
        )


def test_rows_alias_flags_rows_a_multiple_of_4kb_apart():
    """The forward's test for 4K aliasing between four rows of y: CIFAR-10 quick's conv1 (1024
    floats a row) and rows of 2 KB (every second row 4 KB apart) alias; LeNet's conv1 (576 floats:
    2304 B) does not, nor does the padded buffer the forward takes instead (1024 + 32 floats)."""
    assert K._rows_alias(1024, 4) and K._rows_alias(512, 4) and K._rows_alias(1024, 8)
    assert not K._rows_alias(576, 4) and not K._rows_alias(1024 + 32, 4) and not K._rows_alias(100, 4)
