"""The Convolution layer's Winograd route (kernels/winograd.py): which convolutions take it
(``winograd_rule``, ``engine: CAFFE`` to keep im2col), float64 results equal to the direct
convolution and its gradients, float32 results within the documented tolerance of the im2col
route, chunked batches and the step plan's lanes."""

import numpy as np
import pytest
from gradient_check import check_gradient
from layer_util import blob, forward, host, make_layer, run, setup
from test_layers_conv import conv_text, naive_conv

from minicaffe.layers.convolution import winograd_rule

#: float32: Winograd vs im2col, as a fraction of the largest |value| (docs/KERNELS.md, "Winograd")
TOLERANCE = 2e-5


def engine(text, name):
    return text.replace("convolution_param {", f"convolution_param {{ engine: {name}", 1)


@pytest.fixture
def few_tiles(monkeypatch):
    """Small test shapes take the route: the tile count's threshold at 1."""
    import minicaffe.layers.convolution as conv_mod

    monkeypatch.setattr(conv_mod, "WINOGRAD_MIN_TILES", 1)


def test_the_rule(backend):
    host_ = backend.host_lanes
    assert winograd_rule("DEFAULT", True, 1, 20, 50, 5, 5, 1, 1, 1, 1, 128)  # LeNet conv2, a lane of 32
    assert winograd_rule("DEFAULT", True, 1, 32, 64, 5, 5, 1, 1, 1, 1, 200)  # CIFAR-10 quick conv3
    assert winograd_rule("DEFAULT", True, 1, 64, 64, 3, 3, 1, 1, 1, 1, 32)
    assert not winograd_rule("DEFAULT", True, 1, 20, 50, 5, 5, 1, 1, 1, 1, 16)  # 4 images: too few tiles
    assert not winograd_rule("CAFFE", True, 1, 20, 50, 5, 5, 1, 1, 1, 1, 128)
    assert not winograd_rule("DEFAULT", False, 1, 20, 50, 5, 5, 1, 1, 1, 1, 128)  # a GPU backend
    assert not winograd_rule("DEFAULT", True, 2, 20, 50, 5, 5, 1, 1, 1, 1, 128)  # groups
    assert not winograd_rule("DEFAULT", True, 1, 3, 32, 5, 5, 1, 1, 1, 1, 128)  # few input channels
    assert not winograd_rule("DEFAULT", True, 1, 20, 50, 5, 5, 2, 2, 1, 1, 128)  # stride
    assert not winograd_rule("DEFAULT", True, 1, 20, 50, 5, 5, 1, 1, 2, 2, 128)  # dilation
    assert not winograd_rule("DEFAULT", True, 1, 20, 50, 7, 7, 1, 1, 1, 1, 128)  # 3x3 and 5x5 only
    text = conv_text(16, "kernel_size: 5 pad: 2", 1, True)
    x = np.zeros((16, 16, 8, 8))  # 4 tiles per image: 64 in all, 32 per lane with two lanes
    assert run(text, backend, [x])[0].route == ("winograd" if host_ else "im2col")
    assert run(engine(text, "CAFFE"), backend, [x])[0].route == "im2col"


@pytest.mark.parametrize(
    "shape,m,geom,pad",
    [
        ((2, 16, 12, 12), 16, "kernel_size: 5", 0),  # LeNet conv2's geometry, whole tiles
        ((3, 17, 9, 11), 18, "kernel_size: 5 pad: 2", 2),  # CIFAR-10's, partial edge tiles
        ((2, 16, 7, 10), 16, "kernel_size: 3 pad: 1", 1),
    ],
)
def test_float64_forward_and_gradients(backend, rng, shape, m, geom, pad, few_tiles):
    if not backend.host_lanes:
        pytest.skip("the Winograd route runs on the host; a GPU backend's im2col route is tested in test_layers_conv")
    text = conv_text(m, geom, 1, True)
    layer, bottoms, tops, (y,) = run(text, backend, [rng.standard_normal(shape)])
    w, b = host(backend, layer.blobs[0].data), host(backend, layer.blobs[1].data)
    np.testing.assert_allclose(
        y, naive_conv(host(backend, bottoms[0].data), w, b, (pad, pad), (1, 1), (1, 1), 1), atol=1e-10
    )
    check_gradient(layer, bottoms, tops, max_per_blob=20)


def _pair(backend, rng, shape, m, geom, dtype):
    """The same float32 layer by the default route and by engine: CAFFE; forward + backward."""
    text = conv_text(m, geom, 1, True)
    x = rng.standard_normal(shape)
    out = []
    for t in (text, engine(text, "CAFFE")):
        layer = make_layer(t, backend, dtype=dtype)
        bottoms = [blob(backend, x, dtype)]
        tops = setup(layer, bottoms, 1, dtype)
        if out:
            for p, q in zip(layer.blobs, out[0][0].blobs):
                p.data[...] = host(backend, q.data)
        (y,) = forward(layer, bottoms, tops)
        tops[0].diff[...] = np.random.default_rng(1).standard_normal(y.shape)
        layer.backward(tops, [True], bottoms)
        grads = [host(backend, bottoms[0].diff)] + [host(backend, p.diff) for p in layer.blobs]
        out.append((layer, [y] + grads))
    return out


def test_float32_within_the_documented_tolerance_of_im2col(rng, few_tiles):
    from minicaffe.backend import cpu

    (wl, wino), (cl, caffe) = _pair(cpu, rng, (8, 20, 12, 12), 50, "kernel_size: 5", np.float32)
    assert (wl.route, cl.route) == ("winograd", "im2col")
    for name, a, b in zip(("y", "dx", "dW", "db"), wino, caffe):
        err = np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()
        assert err < TOLERANCE, f"{name}: {err:.2e} of max |value|"


NET = """
name: "winogradish"
layer { name: "in" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 7 dim: 16 dim: 11 dim: 11 } shape { dim: 7 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 16 kernel_size: 5 pad: 1 weight_filler { type: "xavier" }
                            bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_step_plan_lanes_give_the_layer_by_layer_result(tmp_path, monkeypatch, dtype):
    """A Winograd convolution in the step plan's lanes (batch 7: unequal slices) against one
    lane and against the layer-by-layer run: each image's tiles are its own, so only the lanes'
    weight-gradient sums differ in order."""
    import minicaffe as caffe
    from minicaffe.parallel import lanes, plan

    monkeypatch.setattr(lanes, "MIN_FLOPS", 0.0)
    saved = lanes.count(), plan.enabled()
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    caffe.set_random_seed(5)
    net = caffe.Net(str(path), caffe.TRAIN, dtype=dtype)
    g = np.random.default_rng(1)
    net.blobs["data"].data[...] = g.standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = g.integers(0, 5, 7)
    assert net.layers[1].route == "winograd"

    def step():
        net.clear_param_diffs()
        loss = [net.forward_backward() for _ in range(2)]
        out = [np.array(loss)] + [b.data.copy() for b in net.blob_list] + [b.diff.copy() for b in net.blob_list]
        return out + [p.diff.copy() for p in net.learnable_params]

    try:
        lanes.set_count(1)
        ref = step()
        lanes.set_count(2)
        assert net.uses_step_plan()
        got = step()
        plan.set_enabled(False)
        by_layer = step()
    finally:
        lanes.set_count(saved[0])
        plan.set_enabled(saved[1])
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for r, a, b in zip(ref, got, by_layer):
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(a, r, rtol=0, atol=tol * scale)
        np.testing.assert_allclose(b, r, rtol=0, atol=tol * scale)


def test_filters_transformed_once_per_change_of_the_weights(rng, few_tiles):
    """Backward reuses forward's transformed filters; a weight written between the two passes
    (pycaffe's ``blob.data[...]``, a gradient check's perturbation) is seen, down to its sign bit."""
    from kernels import winograd
    from minicaffe.backend import cpu

    layer, bottoms, tops, _ = run(
        conv_text(16, "kernel_size: 5", 1, True), cpu, [rng.standard_normal((4, 16, 12, 12))], dtype=np.float32
    )
    assert layer.route == "winograd" and layer.filter_transforms == 1
    dy = rng.standard_normal(tops[0].shape).astype(np.float32)
    tops[0].diff[...] = dy

    def backward():
        layer.backward(tops, [True], bottoms)
        return bottoms[0].diff.copy()

    def reference(w):
        dx = np.empty(bottoms[0].shape, np.float32)
        winograd.bwd_data(dy, w, 0, 0, dx, m=4)
        return dx

    old = layer.blobs[0].data.copy()
    dx = backward()
    assert layer.filter_transforms == 1  # forward's U served backward
    np.testing.assert_allclose(dx, reference(old), rtol=1e-5, atol=1e-5 * np.abs(dx).max())
    forward(layer, bottoms, tops)
    assert layer.filter_transforms == 1  # the weights did not change: nothing to transform

    layer.blobs[0].data[3, 2, 1, 0] += 0.5  # between forward and backward
    dx = backward()
    assert layer.filter_transforms == 2
    new = layer.blobs[0].data.copy()
    np.testing.assert_allclose(dx, reference(new), rtol=1e-5, atol=1e-5 * np.abs(dx).max())
    assert np.abs(dx - reference(old)).max() > 1e-2 * np.abs(dx).max()

    layer.blobs[0].data[0, 0, 0, 0] = 0.0
    backward()
    layer.blobs[0].data[0, 0, 0, 0] = -0.0  # equal as a float, not as bits: transformed again
    backward()
    assert layer.filter_transforms == 4
