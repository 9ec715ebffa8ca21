"""kernels/cblas.py: OpenBLAS's GEMM called from compiled code without the GIL, and through ctypes.

Both ways make the same BLAS call with the same arguments, so their results are identical bit
for bit; against a float64 product they agree within float32 (float64) rounding on any shape
and any layout BLAS reads in place.  Layouts it cannot read are declined (False, c untouched),
and operands that do not fit raise a ValueError that names their shapes."""

import threading
import time

import numpy as np
import pytest

from kernels import cblas

DTYPES = [np.float32, np.float64]


def _need_nogil():
    if not cblas.nogil_available():
        pytest.skip("numpy here is not linked to an OpenBLAS with 64-bit cblas (the ctypes call is tested)")


def _reference(alpha, A, B, beta, c):
    return alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * c.astype(np.float64)


def _tolerance(dtype, A, B, c, alpha, beta):
    """Worst-case rounding of a K-term float sum, with a margin: eps * K * sum |terms|."""
    eps = np.finfo(dtype).eps
    bound = abs(alpha) * (np.abs(A).astype(np.float64) @ np.abs(B)) + abs(beta) * np.abs(c)
    return 4 * eps * (A.shape[1] + 2) * bound + np.finfo(dtype).tiny


def _operands(rng, dtype):
    """(A, B) pairs of odd shapes in every layout BLAS reads in place: contiguous, sub-blocks
    (a leading dimension larger than the row), transposed views, single rows and columns, K=1."""
    big_a = rng.standard_normal((37, 41)).astype(dtype)
    big_b = rng.standard_normal((41, 53)).astype(dtype)
    return [
        (big_a[:7, :13].copy(), big_b[:13, :11].copy()),  # contiguous
        (big_a[3:20, 2:27], big_b[4:29, 5:40]),  # sub-blocks
        (big_a.T[5:25, 7:19], big_b[:12, :35]),  # A transposed (column-major view)
        (big_a[:17, :25], big_b.T[10:35, 3:28]),  # B transposed
        (big_a.T[:9, :31], big_b.T[:31, :5]),  # both transposed
        (big_a[:1, :29], big_b[:29, :17]),  # one row of A
        (big_a[:23, :19], big_b[:19, 4:5]),  # one column of B
        (big_a[:15, 6:7], big_b[2:3, :21]),  # K = 1 (an outer product)
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nogil_gemm_matches_the_product_and_the_ctypes_call_bit_for_bit(dtype):
    _need_nogil()
    rng = np.random.default_rng(3)
    for A, B in _operands(rng, dtype):
        c0 = rng.standard_normal((A.shape[0], B.shape[1])).astype(dtype)
        for alpha, beta in [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25), (1, 1)]:
            c, c_ctypes = c0.copy(), c0.copy()
            assert cblas.gemm(alpha, A, B, beta, c)
            assert cblas.gemm_ctypes(alpha, A, B, beta, c_ctypes)
            np.testing.assert_array_equal(c, c_ctypes)  # one BLAS call, the same arguments
            err = np.abs(c.astype(np.float64) - _reference(alpha, A, B, beta, c0))
            assert (err <= _tolerance(dtype, A, B, c0, alpha, beta)).all(), (A.shape, B.shape, A.strides, B.strides)


def test_beta_zero_does_not_read_c():
    """As in BLAS, beta = 0 overwrites c: NaN already there does not leak into the product."""
    _need_nogil()
    A = np.ones((3, 4), np.float32)
    B = np.ones((4, 5), np.float32)
    c = np.full((3, 5), np.nan, np.float32)
    assert cblas.gemm(1.0, A, B, 0.0, c)
    np.testing.assert_array_equal(c, np.full((3, 5), 4.0, np.float32))


@pytest.mark.parametrize("gemm", [cblas.gemm, cblas.gemm_ctypes], ids=["nogil", "ctypes"])
def test_layouts_blas_cannot_read_and_other_dtypes_are_declined_with_c_untouched(gemm):
    if not cblas.available(np.float32):
        pytest.skip("numpy here is not linked to an OpenBLAS with cblas")
    rng = np.random.default_rng(5)
    A = rng.standard_normal((10, 30)).astype(np.float32)
    B = rng.standard_normal((15, 8)).astype(np.float32)
    c = np.zeros((10, 8), np.float32)
    readonly = np.zeros((10, 8), np.float32)
    readonly.flags.writeable = False
    cases = [
        (A[:, ::2], B, c),  # rows of stride 2
        (A[:, :15], B[::-1], c),  # a negative stride
        (A[:, :15], B, np.asfortranarray(c)),  # c column-major
        (A[:, :15], B, readonly),
        (A[:, :15].astype(np.float64), B, c),  # mixed dtypes: the caller's numpy path
        (A[:, :15], B, c.astype(">f4")),  # not native byte order
        (A[:, :15].astype(np.int32), B.astype(np.int32), c.astype(np.int32)),
        (A[:, :0], B[:0], c),  # K = 0
    ]
    for a, b, out in cases:
        before = out.copy()
        assert not gemm(1.0, a, b, 0.0, out), (a.dtype, a.strides, b.strides, out.strides)
        np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("gemm", [cblas.gemm, cblas.gemm_ctypes], ids=["nogil", "ctypes"])
def test_operands_that_do_not_fit_raise_a_clear_error(gemm):
    if not cblas.available(np.float32):
        pytest.skip("numpy here is not linked to an OpenBLAS with cblas")
    A = np.ones((4, 3), np.float32)
    c = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match=r"A \(4, 3\) @ B \(2, 5\) does not fit c \(4, 5\)"):
        gemm(1.0, A, np.ones((2, 5), np.float32), 0.0, c)
    with pytest.raises(ValueError, match=r"does not fit c \(3, 5\)"):
        gemm(1.0, A, np.ones((3, 5), np.float32), 0.0, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="must be matrices"):
        gemm(1.0, A.ravel(), np.ones((3, 5), np.float32), 0.0, c)
    assert not c.any()


def test_the_compiled_call_releases_the_gil():
    """A Python thread keeps counting while the calling thread is inside a GEMM: the compiled
    call holds the GIL only while numba unboxes its arguments.  The switch interval is raised
    to 50 ms, so the counting thread can take the GIL only when the caller gives it up (a
    GEMM holding it, ~5-20 ms, is never interrupted): holding it, the counter advanced 0 times
    in every call here; released, hundreds of thousands in a call where the scheduler woke the
    counting thread in time (not every call: a fresh CI run saw [686914, 671815, 0, 0, 0]).  So
    one call that lets it count proves the release; a call that holds the GIL never can."""
    _need_nogil()
    import sys

    from minicaffe.parallel import blas

    rng = np.random.default_rng(0)
    A = rng.standard_normal((600, 600)).astype(np.float32)
    c = np.zeros((600, 600), np.float32)
    count, stop = [0], threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    before, interval = blas.get_threads(), sys.getswitchinterval()
    blas.set_threads(1)  # one BLAS thread: the counter has the other core
    cblas.gemm(1.0, A, A, 0.0, c)  # compiled (or loaded from the cache) before anything is counted
    sys.setswitchinterval(0.05)
    thread = threading.Thread(target=counter)
    thread.start()
    try:
        time.sleep(0.01)
        seen = []
        for _ in range(8):  # each call then waits up to 50 ms for the counter to hand the GIL back
            n0 = count[0]
            cblas.gemm(1.0, A, A, 0.0, c)
            seen.append(count[0] - n0)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
        blas.set_threads(before)
    assert max(seen) > 1000, f"the counting thread advanced only {seen} times during the GEMM calls"
