"""Shared checks for the kernel tests: tolerances derived from the dtype and the length of the
reduction, and failures that name the kernel, version, shape, index and both values.

The tolerance model is the classical bound for a floating-point sum of n terms (any order,
with or without FMA): |computed - exact| <= n * eps * sum |term_i|.  A test passes the
"magnitude" (the same computation on absolute values, from the float64 reference) and n;
a bug (a wrong index, a missing term) is off by a whole term, far above that bound.
"""

import numpy as np

DTYPES = (np.float32, np.float64)


def eps(dtype):
    return float(np.finfo(dtype).eps)


def tiny(dtype):
    """The smallest normal number: a result that underflows may differ by this much."""
    return float(np.finfo(dtype).tiny)


def sum_tol(dtype, n_terms, magnitude, extra_roundings=2):
    """Error bound of a dtype sum of ``n_terms`` terms whose absolute values add to
    ``magnitude`` (array or scalar), plus ``extra_roundings`` roundings of the result."""
    return (n_terms + extra_roundings) * eps(dtype) * np.asarray(magnitude, dtype=np.float64) + 2 * tiny(dtype)


def _where(shape_desc):
    return f" {shape_desc}" if shape_desc else ""


def assert_close(actual, expected, tol, *, kernel, version, shape="", note=""):
    """Every |actual - expected| <= tol (elementwise, broadcast); NaN never passes."""
    actual = np.asarray(actual)
    expected = np.asarray(expected, dtype=np.float64)
    head = f"{kernel}[{version}] dtype={actual.dtype}{_where(shape)}"
    if actual.shape != expected.shape:
        raise AssertionError(f"{head}: output shape {actual.shape}, expected {expected.shape}")
    a = actual.astype(np.float64)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), expected.shape)
    diff = np.abs(a - expected)
    bad = ~(diff <= tol)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        ratio = np.where(bad, diff / np.maximum(tol, 1e-300), 0)
        ratio = np.nan_to_num(ratio, nan=np.inf)
        worst = tuple(int(i) for i in np.unravel_index(np.argmax(ratio), ratio.shape))
        raise AssertionError(
            f"{head}: {int(bad.sum())} of {bad.size} elements off; first at index {first}: "
            f"got {a[first]!r}, expected {expected[first]!r}, |diff| {diff[first]:.3g} > "
            f"tol {tol[first]:.3g}; worst at {worst}: got {a[worst]!r}, expected "
            f"{expected[worst]!r}{(' -- ' + note) if note else ''}"
        )


def assert_equal(actual, expected, *, kernel, version, shape="", note=""):
    """Bit-exact (for pure data movement: im2col, the max-pool mask)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    head = f"{kernel}[{version}] dtype={actual.dtype}{_where(shape)}"
    if actual.shape != expected.shape:
        raise AssertionError(f"{head}: output shape {actual.shape}, expected {expected.shape}")
    bad = ~(
        (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        if actual.dtype.kind == "f"
        else (actual == expected)
    )
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{head}: {int(bad.sum())} of {bad.size} elements differ (exact match required); "
            f"first at index {first}: got {actual[first]!r}, expected {expected[first]!r}"
            f"{(' -- ' + note) if note else ''}"
        )


def versions(module, fn):
    """[(version name, function)] of a family's public function, in ladder order."""
    return list(module.VERSIONS[fn].items())
