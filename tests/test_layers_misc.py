"""Tile, Reduction, Crop, MVN, Embed: forward against numpy, gradients, errors."""

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import host, run

from minicaffe.errors import LayerError


@pytest.mark.parametrize("axis, tiles", [(1, 3), (0, 2), (-1, 4)])
def test_tile(backend, rng, axis, tiles):
    x = rng.standard_normal((2, 3, 4))
    layer, bottoms, tops, (y,) = run(f'type: "Tile" tile_param {{ axis: {axis} tiles: {tiles} }}', backend, [x])
    a = axis % 3
    np.testing.assert_array_equal(y, np.tile(x, [tiles if i == a else 1 for i in range(3)]))
    check_gradient(layer, bottoms, tops)


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduction(backend, rng, op, axis):
    from layer_util import away_from

    x = away_from(rng, (2, 3, 4), margin=0.05)
    text = f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: -1.5 }}'
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    a = axis % 3
    flat = x.reshape(int(np.prod(x.shape[:a])), -1)
    f = {"SUM": flat.sum(1), "ASUM": np.abs(flat).sum(1), "SUMSQ": (flat**2).sum(1), "MEAN": flat.mean(1)}[op]
    assert y.shape == x.shape[:a]
    np.testing.assert_allclose(y.reshape(-1), -1.5 * f, rtol=1e-12)
    check_gradient(layer, bottoms, tops, kink=0.0 if op == "ASUM" else None, kink_range=1e-3)


@pytest.mark.parametrize(
    "param, window",
    [
        ("", (slice(None), slice(None), slice(0, 3), slice(0, 4))),  # axis 2, offsets 0
        ("crop_param { offset: 1 }", (slice(None), slice(None), slice(1, 4), slice(1, 5))),
        ("crop_param { axis: 1 offset: 1 offset: 2 offset: 0 }", (slice(None), slice(1, 3), slice(2, 5), slice(0, 4))),
    ],
)
def test_crop(backend, rng, param, window):
    x = rng.standard_normal((2, 4, 5, 6))
    ref = np.zeros((2, 2, 3, 4))
    layer, bottoms, tops, (y,) = run(f'type: "Crop" {param}', backend, [x, ref])
    np.testing.assert_array_equal(y, x[window])
    check_gradient(layer, bottoms, tops, check_bottom=[0])


def test_crop_window_too_big(backend):
    with pytest.raises(LayerError, match="exceeds"):
        run('type: "Crop" crop_param { offset: 3 }', backend, [np.zeros((1, 1, 5, 5)), np.zeros((1, 1, 3, 3))])


@pytest.mark.parametrize(
    "param",
    [
        "",
        "mvn_param { normalize_variance: false }",
        "mvn_param { across_channels: true }",
        "mvn_param { across_channels: true normalize_variance: false }",
    ],
)
def test_mvn(backend, rng, param):
    x = rng.standard_normal((2, 3, 4, 5)) * 2 + 1
    layer, bottoms, tops, (y,) = run(f'type: "MVN" {param}', backend, [x])
    g = x.reshape(2, -1) if "across_channels: true" in param else x.reshape(6, -1)
    want = g - g.mean(1, keepdims=True)
    if "normalize_variance: false" not in param:
        want = want / (want.std(1, keepdims=True) + 1e-9)
    np.testing.assert_allclose(y.reshape(want.shape), want, rtol=1e-10, atol=1e-12)
    check_gradient(layer, bottoms, tops, tol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_embed(backend, rng, bias):
    ids = np.array([[3, 0, 3], [1, 4, 3]], dtype=float)  # repeated ids sum their gradients
    text = (
        f'type: "Embed" embed_param {{ num_output: 4 input_dim: 5 bias_term: {str(bias).lower()} '
        f'weight_filler {{ type: "gaussian" }} bias_filler {{ type: "uniform" }} }}'
    )
    layer, bottoms, tops, (y,) = run(text, backend, [ids])
    w = host(backend, layer.blobs[0].data)
    want = w[ids.astype(int)] + (host(backend, layer.blobs[1].data) if bias else 0)
    assert y.shape == (2, 3, 4)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    check_gradient(layer, bottoms, tops, check_bottom=[])


def test_embed_rejects_bad_ids(backend):
    text = 'type: "Embed" embed_param { num_output: 2 input_dim: 3 }'
    with pytest.raises(LayerError, match="not an integer id"):
        run(text, backend, [np.array([0.0, 3.0])])
    with pytest.raises(LayerError, match="not an integer id"):
        run(text, backend, [np.array([0.5])])
