"""InnerProduct.reshape returns at once when nothing changed since its last call (the net reshapes
every layer on every forward), and redoes everything when the bottom or its top did."""

import numpy as np
import pytest

from minicaffe import proto
from minicaffe.errors import MinicaffeError
from minicaffe.net import TRAIN, Net
from minicaffe.parallel import lanes

NET = """
name: "ip"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 6 dim: 2 dim: 3 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "constant" value: 0.25 } } }
"""


def make():
    net = Net(proto.parse(NET, "NetParameter"), phase=TRAIN)
    return net, net.layer_dict["ip"], net.blobs["x"], net.blobs["y"]


def expected(net, x):
    w, b = (p.data for p in net.layer_dict["ip"].blobs)
    return x.reshape(x.shape[0], -1) @ w.T + b


def test_reshape_follows_the_bottom_and_the_top():
    net, ip, x, y = make()
    rng = np.random.default_rng(0)
    x.data[...] = rng.standard_normal(x.shape)
    net.forward()
    np.testing.assert_allclose(y.data, expected(net, x.data), rtol=1e-5, atol=1e-6)
    # a smaller batch: the top follows, the output is that of the new batch
    x.reshape((3, 2, 3, 2))
    x.data[...] = rng.standard_normal(x.shape)
    net.forward()
    assert y.shape == (3, 4)
    np.testing.assert_allclose(y.data, expected(net, x.data), rtol=1e-5, atol=1e-6)
    # the top reshaped by someone else: the layer's reshape puts it back
    y.reshape((1, 12))
    net.reshape()
    assert y.shape == (3, 4)
    # more lanes: nothing to size (the step plan makes dW by rows after the lanes meet, no
    # per-lane partial gradient is kept)
    previous = lanes.set_count(2)
    try:
        net.reshape()
        assert ip.params_after_lanes and ip.scratch() == []
    finally:
        lanes.set_count(previous)
    # a bottom of the wrong size is still refused, also after cached calls
    x.reshape((3, 5))
    with pytest.raises(MinicaffeError, match="5 inputs per item"):
        net.reshape()
