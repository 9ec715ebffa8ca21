"""Pooling: Caffe's output-size rounding, MAX/AVE/global against loops, gradients, errors."""

import math

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import blob, distinct, make_layer, run, setup

from minicaffe.errors import LayerError


def caffe_pooled(size, k, p, s, ceil=True):
    out = (math.ceil if ceil else math.floor)((size + 2 * p - k) / s) + 1
    if (out - 1) * s >= size + p:  # Caffe: only if p > 0 (see minicaffe/layers/pooling.py)
        out -= 1
    return out


def naive_pool(x, kh, kw, sh, sw, ph, pw, method, ceil=True):
    """Caffe's pooling by loops: windows clipped to the image for MAX; AVE divides by the window
    clipped to (H + ph, W + pw) before clipping to the image."""
    n, c, h, w = x.shape
    oh, ow = caffe_pooled(h, kh, ph, sh, ceil), caffe_pooled(w, kw, pw, sw, ceil)
    y = np.zeros((n, c, oh, ow))
    mask = np.zeros((n, c, oh, ow), dtype=int)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * sh - ph, j * sw - pw
            h1, w1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
            area = (h1 - h0) * (w1 - w0)
            a, b = max(h0, 0), max(w0, 0)
            e, f = min(h1, h), min(w1, w)
            win = x[:, :, a:e, b:f]
            if method == "MAX":
                flat = win.reshape(n, c, -1)
                arg = flat.argmax(axis=2)
                y[:, :, i, j] = flat.max(axis=2)
                mask[:, :, i, j] = (a + arg // (f - b)) * w + b + arg % (f - b)
            else:
                y[:, :, i, j] = win.sum(axis=(2, 3)) / area
    return y, mask


@pytest.mark.parametrize(
    "h, k, p, s, expected",
    [
        (6, 3, 0, 2, 3),  # ceil((6-3)/2)+1 = 3: the last window hangs over the edge (floor would give 2)
        (7, 3, 0, 2, 3),
        (5, 2, 1, 2, 3),  # ceil(5/2)+1 = 4, but window 3 would start at 6 >= H + p = 6: dropped
        (4, 3, 1, 2, 3),  # the CIFAR-10 case: ceil(3/2)+1 = 3, last start 4 < 5 kept
        (1, 1, 0, 1, 1),
        (2, 1, 0, 2, 1),  # kernel < stride, no pad: Caffe would keep an empty window at 2; dropped
    ],
)
def test_caffe_output_rounding(backend, h, k, p, s, expected):
    assert caffe_pooled(h, k, p, s) == expected
    layer, _, tops, _ = run(
        f'type: "Pooling" pooling_param {{ pool: MAX kernel_size: {k} stride: {s} pad: {p} }}',
        backend,
        [np.zeros((1, 1, h, h))],
    )
    assert tops[0].shape == (1, 1, expected, expected)


def test_floor_round_mode(backend):
    _, _, tops, _ = run(
        'type: "Pooling" pooling_param { kernel_size: 3 stride: 2 round_mode: FLOOR }',
        backend,
        [np.zeros((1, 1, 6, 6))],
    )
    assert tops[0].shape == (1, 1, 2, 2)


POOL_CASES = [
    ((2, 3, 7, 6), "kernel_size: 3 stride: 2", (3, 3, 2, 2, 0, 0)),
    ((1, 2, 6, 7), "kernel_size: 3 stride: 2 pad: 1", (3, 3, 2, 2, 1, 1)),
    ((2, 1, 5, 8), "kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0", (2, 3, 1, 2, 1, 0)),
    ((1, 2, 5, 5), "kernel_size: 2 stride: 2 pad: 1", (2, 2, 2, 2, 1, 1)),
    ((2, 2, 9, 9), "kernel_size: 3 stride: 3", (3, 3, 3, 3, 0, 0)),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[1] for c in POOL_CASES])
def test_pooling_forward_and_gradient(backend, rng, method, case):
    shape, geom, (kh, kw, sh, sw, ph, pw) = case
    x = distinct(rng, shape)
    n_tops = 2 if method == "MAX" else 1
    layer, bottoms, tops, outs = run(
        f'type: "Pooling" pooling_param {{ pool: {method} {geom} }}', backend, [x], n_tops=n_tops
    )
    ref, mask = naive_pool(x, kh, kw, sh, sw, ph, pw, method)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-12, atol=1e-12)
    if method == "MAX":
        np.testing.assert_array_equal(outs[1], mask)  # Caffe's second top: the argmax h*W+w
    check_gradient(layer, bottoms, tops, check_tops=[0])


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(backend, rng, method):
    x = distinct(rng, (2, 3, 5, 4))
    layer, bottoms, tops, (y,) = run(
        f'type: "Pooling" pooling_param {{ pool: {method} global_pooling: true }}', backend, [x]
    )
    ref = x.max(axis=(2, 3)) if method == "MAX" else x.mean(axis=(2, 3))
    np.testing.assert_allclose(y.reshape(2, 3), ref, rtol=1e-12)
    check_gradient(layer, bottoms, tops)


def test_pooling_float32(backend, rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    _, _, _, (y,) = run(
        'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }', backend, [x], dtype=np.float32
    )
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, naive_pool(x.astype(np.float64), 3, 3, 2, 2, 1, 1, "AVE")[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "param, shape, message",
    [
        ("pool: STOCHASTIC kernel_size: 2", (1, 1, 4, 4), "STOCHASTIC is not supported"),
        ("kernel_size: 2 pad: 2", (1, 1, 4, 4), r"pad \(2,2\) must be smaller than the kernel"),
        ("stride: 2", (1, 1, 4, 4), "kernel_size is required"),
        ("global_pooling: true kernel_size: 2", (1, 1, 4, 4), "global_pooling"),
        ("kernel_size: 2 kernel_h: 2 kernel_w: 2", (1, 1, 4, 4), "not both"),
        ("kernel_size: 2", (4, 4), "4 axes"),
        ("kernel_size: 5", (1, 1, 3, 3), "smaller than the kernel"),
    ],
)
def test_pooling_errors(backend, param, shape, message):
    layer = make_layer(f'name: "pool1" type: "Pooling" pooling_param {{ {param} }}', backend)
    with pytest.raises(LayerError, match=message) as info:
        setup(layer, [blob(backend, np.zeros(shape))])
    assert "pool1" in str(info.value)


def test_ave_pooling_cannot_give_a_mask(backend):
    layer = make_layer('name: "p" type: "Pooling" pooling_param { pool: AVE kernel_size: 2 }', backend)
    with pytest.raises(LayerError, match="second top"):
        setup(layer, [blob(backend, np.zeros((1, 1, 4, 4)))], n_tops=2)


# -- random geometry (hypothesis) ---------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["MAX", "AVE"]),
    kh=st.integers(1, 4),
    kw=st.integers(1, 4),
    sh=st.integers(1, 3),
    sw=st.integers(1, 3),
    data=st.data(),
)
def test_pooling_random_geometry(backend, method, kh, kw, sh, sw, data):
    ph, pw = data.draw(st.integers(0, kh - 1)), data.draw(st.integers(0, kw - 1))
    h, w = data.draw(st.integers(max(1, kh - 2 * ph), 9)), data.draw(st.integers(max(1, kw - 2 * pw), 9))
    x = distinct(np.random.default_rng(h * 10 + w), (2, 2, h, w))
    text = (
        f'type: "Pooling" pooling_param {{ pool: {method} kernel_h: {kh} kernel_w: {kw} '
        f"stride_h: {sh} stride_w: {sw} pad_h: {ph} pad_w: {pw} }}"
    )
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    np.testing.assert_allclose(y, naive_pool(x, kh, kw, sh, sw, ph, pw, method)[0], rtol=1e-12, atol=1e-12)
    check_gradient(layer, bottoms, tops, max_per_blob=30)
