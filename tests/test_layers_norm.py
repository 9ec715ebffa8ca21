"""LRN, BatchNorm, Scale, Bias: forward against numpy loops, train/test statistics, gradients."""

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import blob, host, make_layer, run, setup

from minicaffe.errors import LayerError


def lrn_ref(x, size, alpha, beta, k, region):
    n, c, h, w = x.shape
    r = (size - 1) // 2
    scale = np.zeros_like(x)
    for ci in range(c):
        for i in range(h):
            for j in range(w):
                if region == "ACROSS_CHANNELS":
                    lo, hi = max(0, ci - r), min(c, ci + r + 1)
                    scale[:, ci, i, j] = k + alpha / size * (x[:, lo:hi, i, j] ** 2).sum(axis=1)
                else:
                    win = x[:, ci, max(0, i - r) : i + r + 1, max(0, j - r) : j + r + 1]
                    scale[:, ci, i, j] = 1 + alpha / size**2 * (win**2).sum(axis=(1, 2))
    return x * scale**-beta


@pytest.mark.parametrize(
    "region, size, shape",
    [
        ("ACROSS_CHANNELS", 5, (2, 7, 3, 2)),
        ("ACROSS_CHANNELS", 3, (1, 2, 3, 3)),
        ("WITHIN_CHANNEL", 3, (2, 2, 5, 4)),
    ],
)
def test_lrn(backend, rng, region, size, shape):
    x = rng.standard_normal(shape)
    text = f'type: "LRN" lrn_param {{ local_size: {size} alpha: 0.8 beta: 0.6 k: 2 norm_region: {region} }}'
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    np.testing.assert_allclose(y, lrn_ref(x, size, 0.8, 0.6, 2.0, region), rtol=1e-12)
    check_gradient(layer, bottoms, tops, max_per_blob=60)


def test_lrn_even_size_is_an_error(backend):
    layer = make_layer('name: "norm1" type: "LRN" lrn_param { local_size: 4 }', backend)
    with pytest.raises(LayerError, match="norm1.*local_size must be odd"):
        setup(layer, [blob(backend, np.zeros((1, 3, 2, 2)))])


# -- BatchNorm --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3, 2, 3), (5, 2), (3, 2, 5)])
def test_batch_norm_train_normalizes_and_keeps_moving_sums(backend, rng, shape):
    x = rng.standard_normal(shape) * 2 + 1
    text = 'type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 eps: 1e-4 }'
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    axes = (0,) + tuple(range(2, len(shape)))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-4), rtol=1e-10, atol=1e-12)
    m = x.size // shape[1]
    np.testing.assert_allclose(host(backend, layer.blobs[0].data), mean.ravel())
    np.testing.assert_allclose(host(backend, layer.blobs[1].data), var.ravel() * m / (m - 1))
    np.testing.assert_allclose(host(backend, layer.blobs[2].data), [1.0])
    layer.forward(bottoms, tops)  # a second batch: sums decay by 0.9
    np.testing.assert_allclose(host(backend, layer.blobs[2].data), [1.9])
    np.testing.assert_allclose(host(backend, layer.blobs[0].data), 1.9 * mean.ravel())
    check_gradient(layer, bottoms, tops, max_per_blob=40)


def test_batch_norm_test_phase_uses_the_stored_statistics(backend, rng):
    x = rng.standard_normal((3, 2, 2, 2))
    layer = make_layer('type: "BatchNorm"', backend, phase="TEST")
    bottoms = [blob(backend, x)]
    tops = setup(layer, bottoms)
    layer.blobs[0].data[...] = np.array([2.0, -4.0])  # sums, with scale factor 2
    layer.blobs[1].data[...] = np.array([8.0, 0.5])
    layer.blobs[2].data[...] = 2.0
    layer.forward(bottoms, tops)
    mean, var = np.array([1.0, -2.0]), np.array([4.0, 0.25])
    ref = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(host(backend, tops[0].data), ref, rtol=1e-12)
    np.testing.assert_allclose(host(backend, layer.blobs[2].data), [2.0])  # unchanged at TEST
    check_gradient(layer, bottoms, tops, check_params=False)


def test_batch_norm_use_global_stats_override_and_lr_mult(backend, rng):
    layer = make_layer('type: "BatchNorm" batch_norm_param { use_global_stats: true }', backend, phase="TRAIN")
    setup(layer, [blob(backend, rng.standard_normal((2, 3)))])
    assert layer.use_global
    assert [p.lr_mult for p in layer.param.param] == [0.0, 0.0, 0.0]  # as Caffe forces
    layer = make_layer('name: "bn" type: "BatchNorm" param { lr_mult: 1 }', backend)
    with pytest.raises(LayerError, match="bn.*cannot be learned"):
        setup(layer, [blob(backend, np.zeros((2, 3)))])


# -- Scale / Bias -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "axis, num_axes, shape", [(1, 1, (2, 3, 4)), (0, -1, (2, 3)), (1, 2, (2, 3, 4, 2)), (-1, 1, (3, 5)), (1, 0, (2, 3))]
)
@pytest.mark.parametrize("bias_term", [False, True])
def test_scale_learned(backend, rng, axis, num_axes, shape, bias_term):
    x = rng.standard_normal(shape)
    text = (
        f'type: "Scale" scale_param {{ axis: {axis} num_axes: {num_axes} bias_term: {str(bias_term).lower()} '
        f'filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}'
    )
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    a = axis % len(shape)
    s = host(backend, layer.blobs[0].data)
    end = len(shape) if num_axes == -1 else a + num_axes
    assert s.shape == shape[a:end]
    bshape = (1,) * a + s.shape + (1,) * (len(shape) - end)
    ref = x * s.reshape(bshape)
    if bias_term:
        ref = ref + host(backend, layer.blobs[1].data).reshape(bshape)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    check_gradient(layer, bottoms, tops)


def test_scale_two_bottoms_and_default_filler(backend, rng):
    x, s = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4))
    layer, bottoms, tops, (y,) = run('type: "Scale" scale_param { num_axes: 2 }', backend, [x, s])
    np.testing.assert_allclose(y, x * s[None], rtol=1e-12)
    assert layer.blobs == []
    check_gradient(layer, bottoms, tops)
    _, _, _, (y,) = run('type: "Scale"', backend, [x])  # default filler: 1
    np.testing.assert_allclose(y, x)


def test_scale_shape_mismatch(backend):
    layer = make_layer('name: "sc" type: "Scale"', backend)
    with pytest.raises(
        LayerError, match=r"sc.*bottom\[1\] of shape \(4\) does not match bottom\[0\] \(2,3,4\) from axis 1"
    ):
        setup(layer, [blob(backend, np.zeros((2, 3, 4))), blob(backend, np.zeros(4))])


@pytest.mark.parametrize("two_bottoms", [False, True])
def test_bias(backend, rng, two_bottoms):
    x = rng.standard_normal((2, 3, 4))
    if two_bottoms:
        b = rng.standard_normal(3)
        layer, bottoms, tops, (y,) = run('type: "Bias"', backend, [x, b])
    else:
        layer, bottoms, tops, (y,) = run('type: "Bias" bias_param { filler { type: "gaussian" } }', backend, [x])
        b = host(backend, layer.blobs[0].data)
    np.testing.assert_allclose(y, x + b[None, :, None], rtol=1e-12)
    check_gradient(layer, bottoms, tops)
