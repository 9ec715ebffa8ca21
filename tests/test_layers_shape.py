"""Layers that move values around: Concat, Slice, Eltwise, Flatten, Reshape, Split, Silence,
Input, and the Python layer."""

import sys
import textwrap

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import blob, distinct, empty, host, make_layer, run, setup

from minicaffe.errors import LayerError


# -- Concat / Slice ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "param, axis",
    [("", 1), ("concat_param { axis: 0 }", 0), ("concat_param { axis: -1 }", 2), ("concat_param { concat_dim: 2 }", 2)],
)
def test_concat(backend, rng, param, axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] += i
    xs = [rng.standard_normal(s) for s in shapes]
    layer, bottoms, tops, (y,) = run(f'type: "Concat" {param}', backend, xs)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=axis))
    check_gradient(layer, bottoms, tops)


def test_concat_shape_error(backend):
    layer = make_layer('name: "cat" type: "Concat"', backend)
    with pytest.raises(LayerError, match=r"cat.*bottoms differ in shape: \(2,3,4,5\) vs \(2,3,4,6\) along axis 3"):
        setup(layer, [blob(backend, np.zeros((2, 3, 4, 5))), blob(backend, np.zeros((2, 3, 4, 6)))])


@pytest.mark.parametrize(
    "param, n_tops, cuts",
    [
        ("slice_param { slice_point: 1 slice_point: 4 }", 3, [1, 4]),
        ("slice_param { axis: 0 }", 2, None),
        ("slice_param { slice_dim: 2 slice_point: 2 }", 2, [2]),
    ],
)
def test_slice(backend, rng, param, n_tops, cuts):
    x = rng.standard_normal((4, 5, 3))
    layer, bottoms, tops, ys = run(f'type: "Slice" {param}', backend, [x], n_tops=n_tops)
    axis = 0 if "axis: 0" in param else (2 if "slice_dim: 2" in param else 1)
    refs = np.split(x, cuts if cuts else n_tops, axis=axis)
    for y, r in zip(ys, refs):
        np.testing.assert_array_equal(y, r)
    check_gradient(layer, bottoms, tops)


def test_slice_errors(backend):
    layer = make_layer('name: "sl" type: "Slice" slice_param { axis: 1 }', backend)
    with pytest.raises(LayerError, match="sl.*5 along axis 1, which does not split evenly into 2"):
        setup(layer, [blob(backend, np.zeros((2, 5)))], n_tops=2)
    layer = make_layer('name: "sl" type: "Slice" slice_param { slice_point: 1 }', backend)
    with pytest.raises(LayerError, match="1 slice_point.*need 2 tops"):
        setup(layer, [blob(backend, np.zeros((2, 5)))], n_tops=3)


# -- Eltwise ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "param, ref",
    [
        ("", lambda a, b, c: a + b + c),
        ("eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }", lambda a, b, c: a - 0.5 * b + 2 * c),
        ("eltwise_param { operation: PROD }", lambda a, b, c: a * b * c),
        ("eltwise_param { operation: PROD stable_prod_grad: false }", lambda a, b, c: a * b * c),
        ("eltwise_param { operation: MAX }", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    ],
)
def test_eltwise(backend, rng, param, ref):
    xs = list(distinct(rng, (3, 2, 3, 5), low=0.2, high=2.0) * rng.choice([-1, 1], (3, 2, 3, 5)))
    layer, bottoms, tops, (y,) = run(f'type: "Eltwise" {param}', backend, xs)
    np.testing.assert_allclose(y, ref(*xs), rtol=1e-12)
    check_gradient(layer, bottoms, tops)


def test_eltwise_max_ties_follow_caffe(backend):
    a, b, c = np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([1.0, 2.0])
    layer, bottoms, tops, _ = run('type: "Eltwise" eltwise_param { operation: MAX }', backend, [a, b, c])
    tops[0].diff[...] = 1.0
    layer.backward(tops, [True] * 3, bottoms)
    # bottom 0 vs 1: a tie goes to 1; later bottoms must be strictly greater to win
    np.testing.assert_array_equal([host(backend, x.diff) for x in bottoms], [[0, 1], [1, 0], [0, 0]])


def test_eltwise_errors(backend):
    layer = make_layer('name: "el" type: "Eltwise" eltwise_param { coeff: 1 }', backend)
    with pytest.raises(LayerError, match="el.*coeff given 1 time.*2 bottoms"):
        setup(layer, [blob(backend, np.zeros(2)), blob(backend, np.zeros(2))])
    layer = make_layer('name: "el" type: "Eltwise"', backend)
    with pytest.raises(LayerError, match=r"bottoms differ in shape: bottom\[0\] \(2,3\) vs bottom\[1\] \(3,2\)"):
        setup(layer, [blob(backend, np.zeros((2, 3))), blob(backend, np.zeros((3, 2)))])


# -- Flatten / Reshape ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "param, shape",
    [
        ("", (2, 60)),
        ("flatten_param { axis: 2 }", (2, 3, 20)),
        ("flatten_param { axis: 0 end_axis: 1 }", (6, 4, 5)),
        ("flatten_param { axis: -2 }", (2, 3, 20)),
    ],
)
def test_flatten(backend, rng, param, shape):
    x = rng.standard_normal((2, 3, 4, 5))
    layer, bottoms, tops, (y,) = run(f'type: "Flatten" {param}', backend, [x])
    np.testing.assert_array_equal(y, x.reshape(shape))
    check_gradient(layer, bottoms, tops, max_per_blob=30)


@pytest.mark.parametrize(
    "dims, axis, num_axes, shape",
    [
        ("dim: 0 dim: -1", 0, -1, (2, 60)),
        ("dim: -1 dim: 4", 0, -1, (30, 4)),
        ("dim: 2 dim: 2", 2, 1, (2, 3, 2, 2, 5)),
        ("dim: 1", 1, 0, (2, 1, 3, 4, 5)),
        ("dim: 0 dim: 0 dim: 20", 0, -1, (2, 3, 20)),
        ("dim: -1", -3, 2, (2, 3, 20)),  # negative axes count from one past the end, as in Caffe
    ],
)
def test_reshape(backend, rng, dims, axis, num_axes, shape):
    x = rng.standard_normal((2, 3, 4, 5))
    text = f'type: "Reshape" reshape_param {{ shape {{ {dims} }} axis: {axis} num_axes: {num_axes} }}'
    layer, bottoms, tops, (y,) = run(text, backend, [x])
    np.testing.assert_array_equal(y, x.reshape(shape))
    check_gradient(layer, bottoms, tops, max_per_blob=30)


@pytest.mark.parametrize(
    "dims, message",
    [
        ("dim: -1 dim: -1", "more than one -1"),
        ("dim: 7 dim: -1", "cannot infer"),
        ("dim: 3 dim: 3", "holds 9 values"),
        ("dim: 0 dim: 0 dim: 0", "no axis 2"),
    ],
)
def test_reshape_errors(backend, dims, message):
    layer = make_layer(f'name: "rs" type: "Reshape" reshape_param {{ shape {{ {dims} }} }}', backend)
    with pytest.raises(LayerError, match="rs.*" + message):
        setup(layer, [blob(backend, np.zeros((2, 6)))])


# -- Split / Silence / Input ------------------------------------------------------------------------
def test_split(backend, rng):
    x = rng.standard_normal((2, 3))
    layer, bottoms, tops, ys = run('type: "Split"', backend, [x], n_tops=3)
    for y in ys:
        np.testing.assert_array_equal(y, x)
    check_gradient(layer, bottoms, tops)
    # in place (the Net may hand the bottom itself as top 0): the diffs still sum
    b = blob(backend, x)
    t1 = empty(backend)
    layer = make_layer('type: "Split"', backend)
    layer.setup([b], [b, t1])
    layer.forward([b], [b, t1])
    b.diff[...] = 1.0
    t1.diff[...] = 2.0
    layer.backward([b, t1], [True], [b])
    np.testing.assert_array_equal(host(backend, b.diff), np.full((2, 3), 3.0))


def test_silence(backend, rng):
    layer, bottoms, tops, _ = run(
        'type: "Silence"', backend, [rng.standard_normal(3), rng.standard_normal(2)], n_tops=0
    )
    bottoms[0].diff[...] = 5
    layer.backward([], [True, False], bottoms)
    assert np.all(host(backend, bottoms[0].diff) == 0)


def test_input(backend):
    layer = make_layer('type: "Input" input_param { shape { dim: 2 dim: 3 } }', backend)
    tops = setup(layer, [], n_tops=2)
    assert [t.shape for t in tops] == [(2, 3), (2, 3)]
    layer = make_layer('type: "Input" input_param { shape { dim: 2 } shape { dim: 4 dim: 1 } }', backend)
    tops = setup(layer, [], n_tops=2)
    assert [t.shape for t in tops] == [(2,), (4, 1)]
    layer = make_layer('name: "in" type: "Input" input_param { shape { dim: 2 } shape { dim: 4 } }', backend)
    with pytest.raises(LayerError, match="in.*2 shapes for 3 tops"):
        setup(layer, [], n_tops=3)


# -- Python -----------------------------------------------------------------------------------------
PYLOSS = textwrap.dedent('''
    import numpy as np
    import minicaffe as caffe

    class EuclideanLossLayer(caffe.Layer):
        """pycaffe's examples/pycaffe/layers/pyloss.py, as users write it."""
        def setup(self, bottom, top):
            if len(bottom) != 2:
                raise Exception("Need two inputs to compute distance.")
            self.scale = float(self.param_str or 1)

        def reshape(self, bottom, top):
            if bottom[0].count != bottom[1].count:
                raise Exception("Inputs must have the same dimension.")
            self.diff = np.zeros_like(bottom[0].data, dtype=np.float64)
            top[0].reshape(1)

        def forward(self, bottom, top):
            self.diff[...] = bottom[0].data - bottom[1].data
            top[0].data[...] = self.scale * np.sum(self.diff ** 2) / bottom[0].num / 2.

        def backward(self, top, propagate_down, bottom):
            for i in range(2):
                if not propagate_down[i]:
                    continue
                sign = 1 if i == 0 else -1
                bottom[i].diff[...] = sign * self.scale * self.diff / bottom[i].num
''')


def test_python_layer(backend, rng, tmp_path, monkeypatch):
    (tmp_path / "mc_pyloss.py").write_text(PYLOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    text = (
        'type: "Python" python_param { module: "mc_pyloss" layer: "EuclideanLossLayer" param_str: "2" } loss_weight: 1'
    )
    layer, bottoms, tops, (loss,) = run(text, backend, [a, b])
    np.testing.assert_allclose(float(loss[0]), 2 * ((a - b) ** 2).sum() / 3 / 2)
    assert layer.impl.param_str == "2" and layer.impl.phase == "TRAIN"
    check_gradient(layer, bottoms, tops, unit_top_weights=True)
    sys.modules.pop("mc_pyloss", None)


def test_python_layer_errors(backend):
    with pytest.raises(LayerError, match="py.*cannot import python_param module 'no_such_module_xyz'"):
        make_layer('name: "py" type: "Python" python_param { module: "no_such_module_xyz" layer: "L" }', backend)
    with pytest.raises(LayerError, match="module 'json' has no class 'Nope'"):
        make_layer('name: "py" type: "Python" python_param { module: "json" layer: "Nope" }', backend)
