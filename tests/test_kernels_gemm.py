"""GEMM: every version (BLAS baseline and the numba ladder) against the float64 reference on
random shapes (primes, size 1, sizes that straddle the block and micro-tile edges), all four
transpose cases, alpha/beta, beta == 0 ignoring NaN in c, c aliasing an input, and strided
(non-contiguous) inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, sum_tol, versions

from kernels import gemm as K

SETTINGS = settings(max_examples=25, deadline=None)
dims = st.sampled_from([1, 2, 3, 5, 7, 8, 13, 17, 31, 33, 65])


def _tol(dtype, trans_a, trans_b, alpha, a, b, beta, c):
    K_ = a.shape[0] if trans_a else a.shape[1]
    mag = K.gemm_reference(trans_a, trans_b, abs(alpha), np.abs(a), np.abs(b), abs(beta), np.abs(c))
    return sum_tol(dtype, K_ + 2, mag, extra_roundings=3)


@SETTINGS
@given(
    dims,
    dims,
    dims,
    st.booleans(),
    st.booleans(),
    st.sampled_from([(1.0, 0.0), (-0.5, 0.0), (1.0, 1.0), (2.0, 0.25)]),
    st.integers(0, 2**32 - 1),
)
def test_every_version(M, N, Kd, trans_a, trans_b, ab, seed):
    alpha, beta = ab
    rng = np.random.default_rng(seed)
    a64 = rng.standard_normal((Kd, M) if trans_a else (M, Kd))
    b64 = rng.standard_normal((N, Kd) if trans_b else (Kd, N))
    c64 = rng.standard_normal((M, N))
    desc = f"M,N,K={M},{N},{Kd} trans={trans_a:d}{trans_b:d} alpha,beta={alpha},{beta}"
    for dtype in DTYPES:
        a, b, c0 = a64.astype(dtype), b64.astype(dtype), c64.astype(dtype)
        if beta == 0:
            c0[...] = np.nan  # beta == 0: c must not be read
        ref = K.gemm_reference(trans_a, trans_b, alpha, a, b, beta, c0)
        tol = _tol(dtype, trans_a, trans_b, alpha, a, b, beta, np.nan_to_num(c0))
        for ver, fn in versions(K, "gemm"):
            c = c0.copy()
            fn(trans_a, trans_b, alpha, a, b, beta, c)
            assert_close(c, ref, tol, kernel="gemm", version=ver, shape=desc)


@pytest.mark.parametrize(
    "shape",
    [
        (64, 500, 800, True),
        (20, 1100, 25, False),
        (50, 64, 600, False),
        (130, 70, 300, True),
        (133, 70, 300, False),
        (9, 1030, 70, False),
    ],
)
def test_engine_shapes(shape):
    """Engine-like shapes, big enough to cross every blocking boundary of the ladder and to
    take both of v3_micro's kernels (dot-product for a transposed B or many rows of A, AXPY for an
    untransposed B with short K or few rows)."""
    M, N, Kd, tb = shape
    rng = np.random.default_rng(11)
    a = rng.standard_normal((M, Kd)).astype(np.float32)
    b = rng.standard_normal((N, Kd) if tb else (Kd, N)).astype(np.float32)
    ref = K.gemm_reference(False, tb, 1.0, a, b, 0.0, None)
    tol = _tol(np.float32, False, tb, 1.0, a, b, 0.0, np.zeros((M, N)))
    for ver, fn in versions(K, "gemm"):
        if ver == "v1_naive" and M * N * Kd > 2e6:
            continue  # seconds, and nothing new to learn
        c = np.empty((M, N), np.float32)
        fn(False, tb, 1.0, a, b, 0.0, c)
        assert_close(c, ref, tol, kernel="gemm", version=ver, shape=f"M,N,K={M},{N},{Kd} trans_b={tb}")


def test_output_aliasing_an_input():
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((9, 9))
    ref = K.gemm_reference(False, True, 1.5, x0, x0, 0.5, x0)
    for ver, fn in versions(K, "gemm"):
        x = x0.copy()
        fn(False, True, 1.5, x, x, 0.5, x)
        assert_close(
            x, ref, sum_tol(np.float64, 12, np.abs(ref) + 10), kernel="gemm", version=ver, shape="c is a is b (9x9)"
        )


def test_strided_inputs():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((12, 22)).astype(np.float32)[:, ::2]  # (12, 11), strided
    b = rng.standard_normal((22, 9)).astype(np.float32)[::2]  # (11, 9)
    ref = K.gemm_reference(False, False, 1.0, a, b, 0.0, None)
    for ver, fn in versions(K, "gemm"):
        c = np.empty((12, 9), np.float32)
        fn(False, False, 1.0, a, b, 0.0, c)
        assert_close(
            c,
            ref,
            sum_tol(np.float32, 14, np.abs(a) @ np.abs(b)),
            kernel="gemm",
            version=ver,
            shape="strided a (12, 11), b (11, 9)",
        )


def test_shape_mismatch_names_the_shapes():
    a = np.zeros((3, 4), np.float32)
    b = np.zeros((5, 2), np.float32)
    for ver, fn in versions(K, "gemm"):
        with pytest.raises(ValueError, match=r"op\(a\) \(3, 4\) @ op\(b\) \(5, 2\)"):
            fn(False, False, 1.0, a, b, 0.0, np.zeros((3, 2), np.float32))


@pytest.mark.parametrize("fn", [K.gemm_blas, K.gemm_dot], ids=["blas", "dot"])
@pytest.mark.parametrize("trans_a", [False, True])
def test_blas_accumulates_in_row_blocks_without_a_product_temporary(trans_a, fn):
    """beta != 0 (a weight gradient accumulated into its diff): BLAS takes beta itself (cblas),
    and numpy's dot path computes the product a block of rows at a time in a small per-thread
    scratch, so a product larger than the block (here 3 blocks and a remainder) is summed into c
    correctly; neither allocates an M x N array (tracemalloc sees numpy's data buffers)."""
    import tracemalloc

    M, N, Kd = 2 * K.ACC_BLOCK // 600 + 7, 600, 5  # rows per block: ACC_BLOCK // N
    rng = np.random.default_rng(5)
    a = rng.standard_normal((Kd, M) if trans_a else (M, Kd)).astype(np.float32)
    b = rng.standard_normal((Kd, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    for alpha, beta in [(1.0, 1.0), (0.5, 2.0)]:
        ref = K.gemm_reference(trans_a, False, alpha, a, b, beta, c0)
        c = c0.copy()
        fn(trans_a, False, alpha, a, b, beta, c)  # warms this thread's scratch
        tol = _tol(np.float32, trans_a, False, alpha, a, b, beta, c0)
        assert_close(c, ref, tol, kernel="gemm", version="blas", shape=f"M,N,K={M},{N},{Kd} beta={beta}")
    c = c0.copy()
    tracemalloc.start()
    try:
        fn(trans_a, False, 1.0, a, b, 1.0, c)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < c.nbytes // 10, f"{fn.__name__} with beta=1 allocated {peak} bytes (c is {c.nbytes})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_cblas_reads_rows_and_transposes_in_place_and_declines_other_layouts(dtype):
    """The direct cblas call takes row-major operands, transposed views (a flag) and sub-blocks
    of larger arrays (a leading dimension) as they are, with alpha and beta; an operand whose
    rows are not unit stride, or a column-major c, is declined (False, c untouched) and
    gemm_blas goes through numpy instead, with the same result."""
    from kernels import cblas

    if not cblas.available(dtype):
        pytest.skip("numpy here is not linked to an OpenBLAS with cblas (the dot path is tested above)")
    rng = np.random.default_rng(11)
    big_a = rng.standard_normal((40, 30)).astype(dtype)
    big_b = rng.standard_normal((30, 50)).astype(dtype)
    c0 = rng.standard_normal((40, 60)).astype(dtype)
    cases = [
        (big_a[3:20, 2:27], big_b[4:29, 5:40]),  # sub-blocks: lda 30, ldb 50
        (big_a.T[5:25, 7:19], big_b[:12, :35]),  # A transposed
        (big_a[:17, :25], big_b.T[10:35, 3:28]),  # B transposed
    ]
    for A, B in cases:
        for alpha, beta in [(1.0, 0.0), (0.5, 1.0), (2.0, -0.5)]:
            start = c0[: A.shape[0], : B.shape[1]]
            c = start.copy()
            ref = K.gemm_reference(False, False, alpha, A, B, beta, start)
            assert cblas.gemm(alpha, A, B, beta, c)
            assert_close(c, ref, _tol(dtype, False, False, alpha, A, B, beta, start), kernel="gemm", version="cblas")
    A, B = big_a[:10, ::2], big_b[:15, :8]  # rows of stride 2: not BLAS's layout
    c = np.zeros((10, 8), dtype)
    assert not cblas.gemm(1.0, A, B, 0.0, c)
    assert not c.any()
    K.gemm_blas(False, False, 1.0, A, B, 0.0, c)
    np.testing.assert_allclose(c, A.astype(np.float64) @ B, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4)
    cf = np.asfortranarray(np.zeros((10, 8), dtype))
    assert not cblas.gemm(1.0, np.ascontiguousarray(A), B, 0.0, cf)


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_runs_the_dot_kernel_only_where_it_wins(dtype):
    """The engine's default ``auto``: on a convolution weight-gradient shape (dY @ col^T, k long)
    with BLAS on one thread it gives v5_wide's result bit for bit (and the reference's within the
    dtype's tolerance, beta = 1 accumulating); with BLAS on two threads, a short k or a tiny
    c, BLAS's.  Without AVX-512 it is BLAS everywhere."""
    rng = np.random.default_rng(7)
    M, N, Kd = 71, 67, K.DOT_MIN_K + 13  # c.size >= DOT_MIN_C
    a = rng.standard_normal((M, Kd)).astype(dtype)
    b = rng.standard_normal((N, Kd)).astype(dtype)
    c0 = rng.standard_normal((M, N)).astype(dtype)
    v5, blas = K.VERSIONS["gemm"]["v5_wide"], K.gemm_blas

    def run(fn, *args):
        c = c0.copy()
        fn(*args, c)
        return c

    saved = K._blas_threads[0]
    try:
        K.note_blas_threads(1)
        got = run(K.gemm_auto, False, True, 1.0, a, b, 1.0)
        want = run(v5 if K.WIDE_TILES else blas, False, True, 1.0, a, b, 1.0)
        np.testing.assert_array_equal(got, want)
        ref = K.gemm_reference(False, True, 1.0, a, b, 1.0, c0)
        assert_close(got, ref, _tol(dtype, False, True, 1.0, a, b, 1.0, c0), kernel="gemm", version="auto")
        short = np.ascontiguousarray(a[:, : K.DOT_MIN_K - 1]), np.ascontiguousarray(b[:, : K.DOT_MIN_K - 1])
        np.testing.assert_array_equal(
            run(K.gemm_auto, False, True, 1.0, *short, 0.0), run(blas, False, True, 1.0, *short, 0.0)
        )
        K.note_blas_threads(2)
        np.testing.assert_array_equal(
            run(K.gemm_auto, False, True, 1.0, a, b, 1.0), run(blas, False, True, 1.0, a, b, 1.0)
        )
    finally:
        K.note_blas_threads(saved)
