"""Neuron layers (one bottom, one top of its shape): ReLU, Sigmoid, TanH, Power, AbsVal, ELU,
PReLU, Dropout -- forward against numpy formulas, gradients, in-place runs."""

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import away_from, blob, empty, host, make_layer, run, setup

from minicaffe.errors import LayerError
from minicaffe.rng import set_random_seed

SHAPES = [(2, 3, 5, 3), (7,), (3, 5)]

NEURONS = {
    # type text: (reference y = f(x), kink or None)
    'type: "ReLU"': (lambda x: np.maximum(x, 0), 0.0),
    'type: "ReLU" relu_param { negative_slope: 0.1 }': (lambda x: np.where(x > 0, x, 0.1 * x), 0.0),
    'type: "Sigmoid"': (lambda x: 1 / (1 + np.exp(-x)), None),
    'type: "TanH"': (np.tanh, None),
    'type: "AbsVal"': (np.abs, 0.0),
    'type: "ELU" elu_param { alpha: 0.7 }': (lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)), 0.0),
    'type: "Power" power_param { power: 2.5 scale: 0.5 shift: 2 }': (lambda x: (2 + 0.5 * x) ** 2.5, None),
    'type: "Power" power_param { power: -1 scale: 1 shift: 3 }': (lambda x: 1 / (3 + x), None),
    'type: "Power" power_param { scale: -2 shift: 1 }': (lambda x: 1 - 2 * x, None),
    'type: "Power" power_param { power: 0 }': (lambda x: np.ones_like(x), None),
    'type: "Exp"': (np.exp, None),
    'type: "Exp" exp_param { base: 2 scale: 0.5 shift: -1 }': (lambda x: 2.0 ** (0.5 * x - 1), None),
    'type: "Log" log_param { shift: 3 }': (lambda x: np.log(3 + x), None),
    'type: "Log" log_param { base: 10 scale: -2 shift: 5 }': (lambda x: np.log10(5 - 2 * x), None),
    'type: "BNLL"': (lambda x: np.log1p(np.exp(x)), None),
    'type: "Threshold" threshold_param { threshold: 0.3 }': (lambda x: (x > 0.3).astype(float), 0.3),
    'type: "Clip" clip_param { min: -0.5 max: 0.8 }': (lambda x: np.clip(x, -0.5, 0.8), None),
    'type: "Swish"': (lambda x: x / (1 + np.exp(-x)), None),
    'type: "Swish" swish_param { beta: 1.7 }': (lambda x: x / (1 + np.exp(-1.7 * x)), None),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("text", list(NEURONS))
def test_neuron_forward_and_gradient(backend, rng, text, shape):
    ref, kink = NEURONS[text]
    x = away_from(rng, shape, margin=0.05, low=-2, high=2) if kink is not None else rng.uniform(-2, 2, shape)
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    np.testing.assert_allclose(y, ref(x), rtol=1e-12, atol=1e-12)
    check_gradient(layer, bottoms, tops, kink=kink, kink_range=1e-3)


@pytest.mark.parametrize(
    "text", list(NEURONS) + ['type: "PReLU"', 'type: "Dropout"', 'type: "LRN"', 'type: "BatchNorm"', 'type: "Scale"']
)
def test_in_place_equals_out_of_place(backend, rng, text):
    """The Net runs these layers in place (top = bottom); results must not change."""
    kink = NEURONS.get(text, (None, None))[1]
    x = away_from(rng, (2, 3, 4, 3), margin=0.05) if kink is not None else rng.uniform(-1, 1, (2, 3, 4, 3))
    dy = rng.standard_normal(x.shape)
    results = []
    for in_place in (False, True):
        set_random_seed(5)
        layer = make_layer(text, backend)
        b = blob(backend, x)
        t = b if in_place else empty(backend)
        layer.setup([b], [t])
        set_random_seed(6)
        layer.reshape([b], [t])
        layer.forward([b], [t])
        y = host(backend, t.data).copy()
        t.diff[...] = dy
        layer.backward([t], [True], [b])
        results.append((y, host(backend, b.diff).copy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-12, atol=1e-12)


# -- PReLU ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_prelu(backend, rng, shared):
    x = away_from(rng, (2, 3, 4, 5), margin=0.05)
    text = f'type: "PReLU" prelu_param {{ channel_shared: {str(shared).lower()} filler {{ type: "uniform" min: 0.1 max: 0.4 }} }}'
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    a = host(backend, layer.blobs[0].data)
    assert a.shape == ((1,) if shared else (3,))
    slope = a.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(y, np.where(x > 0, x, slope * x), rtol=1e-12)
    check_gradient(layer, bottoms, tops, kink=0.0, kink_range=1e-3)


def test_prelu_default_slope_is_a_quarter(backend):
    layer, _, _, (y,) = run('type: "PReLU"', backend, [-np.ones((1, 2, 1, 1))])
    np.testing.assert_allclose(y, -0.25)


# -- Dropout ----------------------------------------------------------------------------------------
def test_dropout_train_scales_kept_values_and_drops_the_rest(backend, rng):
    x = rng.uniform(1, 2, (4, 50, 5))
    layer, bottoms, tops, (y,) = run('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', backend, [x])
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-12)
    assert abs(kept.mean() - 0.7) < 0.05
    tops[0].diff[...] = 1.0
    layer.backward(tops, [True], bottoms)
    np.testing.assert_allclose(host(backend, bottoms[0].diff), kept / 0.7)
    check_gradient(layer, bottoms, tops, max_per_blob=60)


def test_dropout_test_phase_is_identity(backend, rng):
    x = rng.standard_normal((3, 4))
    layer, bottoms, tops, (y,) = run('type: "Dropout" dropout_param { dropout_ratio: 0.5 }', backend, [x], phase="TEST")
    np.testing.assert_array_equal(y, x)
    check_gradient(layer, bottoms, tops)


def test_dropout_mask_follows_the_seed(backend, rng):
    x = rng.uniform(1, 2, (10, 10))
    masks = []
    for seed in (3, 3, 4):
        set_random_seed(seed)
        _, _, _, (y,) = run('type: "Dropout"', backend, [x])
        masks.append(y != 0)
    np.testing.assert_array_equal(masks[0], masks[1])
    assert (masks[0] != masks[2]).any()


def test_dropout_ratio_must_be_below_one(backend):
    layer = make_layer('name: "drop" type: "Dropout" dropout_param { dropout_ratio: 1.0 }', backend)
    with pytest.raises(LayerError, match=r"drop.*dropout_ratio must be in \[0, 1\)"):
        setup(layer, [blob(backend, np.zeros(3))])


def test_neuron_float32(backend, rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    for text in ('type: "ReLU"', 'type: "Sigmoid"', 'type: "TanH"'):
        _, _, _, (y,) = run(text, backend, [x], dtype=np.float32)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, NEURONS[text][0](x.astype(np.float64)), rtol=1e-6, atol=1e-6)


def test_neuron_arity_errors_name_the_layer(backend):
    layer = make_layer('name: "r" type: "ReLU"', backend)
    with pytest.raises(LayerError, match=r"layer 'r' \(type ReLU\): takes exactly 1 bottom"):
        setup(layer, [blob(backend, np.zeros(2)), blob(backend, np.zeros(2))])
    layer = make_layer('name: "r" type: "ReLU"', backend)
    with pytest.raises(LayerError, match="takes exactly 1 top"):
        setup(layer, [blob(backend, np.zeros(2))], n_tops=2)
