"""Softmax and softmax loss: every version against the float64 reference on random
(outer, C, inner) shapes and large logits (the max subtraction), both dtypes; the loss with
ignore labels; bad labels raise a ValueError that names the label and its position."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_check import DTYPES, assert_close, eps, sum_tol, tiny, versions

from kernels import softmax as K

SETTINGS = settings(max_examples=30, deadline=None)

shapes = st.tuples(st.integers(1, 5), st.sampled_from([1, 2, 3, 7, 10, 13]), st.sampled_from([1, 2, 5, 9]))


@SETTINGS
@given(shapes, st.sampled_from([1.0, 10.0, 300.0]), st.integers(0, 2**32 - 1))
def test_softmax_fwd_bwd_every_version(shape, scale, seed):
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal(shape) * scale + 50 * scale  # large: exp(x) overflows
    dy64 = rng.standard_normal(shape)
    C = shape[1]
    for dtype in DTYPES:
        x, dy = x64.astype(dtype), dy64.astype(dtype)
        y_ref = K.softmax_fwd_reference(x)
        spread = float((x.max(axis=1) - x.min(axis=1)).max())
        # exp(x - max) loses |x - max| * eps/2 relatively; the sum adds C roundings
        tol = (C + 6 + spread) * eps(dtype) * y_ref + 2 * tiny(dtype)
        for ver, fn in versions(K, "softmax_fwd"):
            y = np.full(shape, np.nan, dtype)
            fn(x, y)
            assert_close(y, y_ref, tol, kernel="softmax_fwd", version=ver, shape=str(shape))
        y = y_ref.astype(dtype)
        dx_ref = K.softmax_bwd_reference(y, dy)
        dot = np.abs(dy.astype(np.float64) * y).sum(axis=1, keepdims=True)
        mag = np.abs(y) * (np.abs(dy) + dot)
        for ver, fn in versions(K, "softmax_bwd"):
            dx = np.full(shape, np.nan, dtype)
            fn(y, dy, dx)
            assert_close(dx, dx_ref, sum_tol(dtype, C, mag), kernel="softmax_bwd", version=ver, shape=str(shape))


@SETTINGS
@given(shapes, st.booleans(), st.sampled_from([1.0, 0.5, -2.0, 1 / 64]), st.integers(0, 2**32 - 1))
def test_softmax_loss_every_version(shape, has_ignore, scale, seed):
    rng = np.random.default_rng(seed)
    outer, C, inner = shape
    prob64 = K.softmax_fwd_reference(rng.standard_normal(shape) * 5)
    prob64[0, 0, 0] = 0.0  # -log(0) is clamped at FLT_MIN
    label = rng.integers(0, C, (outer, inner)).astype(np.float64)
    ignore = 255
    if has_ignore:
        label[rng.random((outer, inner)) < 0.3] = ignore
    for dtype in DTYPES:
        prob, lab = prob64.astype(dtype), label.astype(dtype)
        loss_ref, count_ref = K.softmax_loss_fwd_reference(prob, lab, ignore, has_ignore)
        for ver, fn in versions(K, "softmax_loss_fwd"):
            loss, count = fn(prob, lab, ignore, has_ignore)
            assert count == count_ref, f"softmax_loss_fwd[{ver}] {shape}: count {count} != {count_ref}"
            assert_close(
                np.array(loss),
                loss_ref,
                sum_tol(np.float64, outer * inner + 4, abs(loss_ref)),
                kernel="softmax_loss_fwd",
                version=ver,
                shape=str(shape),
            )
        g_ref = K.softmax_loss_bwd_reference(prob, lab, ignore, has_ignore, scale)
        for ver, fn in versions(K, "softmax_loss_bwd"):
            dx = np.full(shape, np.nan, dtype)
            fn(prob, lab, ignore, has_ignore, scale, dx)
            assert_close(
                dx,
                g_ref,
                3 * eps(dtype) * abs(scale) * (np.abs(prob) + 1),
                kernel="softmax_loss_bwd",
                version=ver,
                shape=str(shape),
            )


@pytest.mark.parametrize("bad", [3.0, -1.0, 255.0, np.nan, 1e30])
def test_bad_label_raises_naming_it(bad):
    prob = np.full((2, 3, 2), 1 / 3, np.float32)
    label = np.zeros((2, 2), np.float32)
    label[1, 0] = bad
    for ver, fn in versions(K, "softmax_loss_fwd"):
        with pytest.raises(
            ValueError,
            match=r"label .* at position \(outer=1, inner=0\) is "
            r"outside \[0, 3\)",
        ):
            fn(prob, label, 255, bad != 255.0 and False)
    for ver, fn in versions(K, "softmax_loss_bwd"):
        with pytest.raises(ValueError, match=r"position \(outer=1, inner=0\)"):
            fn(prob, label, 255, False, 1.0, np.empty_like(prob))


def test_ignore_label_out_of_range_is_fine():
    prob = np.full((2, 3, 1), 1 / 3)
    label = np.array([[255.0], [2.0]])
    for ver, fn in versions(K, "softmax_loss_fwd"):
        loss, count = fn(prob, label, 255, True)
        assert count == 1 and abs(loss - np.log(3)) < 1e-12, f"softmax_loss_fwd[{ver}]"
    for ver, fn in versions(K, "softmax_loss_bwd"):
        dx = np.full_like(prob, np.nan)
        fn(prob, label, 255, True, 2.0, dx)
        assert np.allclose(dx[0, :, 0], 0) and np.allclose(dx[1, :, 0], [2 / 3, 2 / 3, -4 / 3])
