"""Lesson 1: blobs and layers.

A Blob is a pair of arrays of one shape: ``data`` (values going forward) and ``diff`` (gradients
coming back). A Layer reads its bottom blobs and writes its top blobs in ``forward``, and in
``backward`` turns the tops' diffs into the bottoms' diffs (and its parameters' diffs).
"""

import numpy as np

import minicaffe as caffe
from minicaffe import proto
from minicaffe.blob import Blob
from minicaffe.layer import create_layer

caffe.set_random_seed(0)

# -- 1. a blob ---------------------------------------------------------------------------------
x = Blob((2, 3, 5, 5), name="x")
x.data[...] = np.random.default_rng(0).standard_normal(x.shape)
print("blob", x.name, "shape", x.shape, "count", x.count)

# -- 2. a layer from its prototxt text ---------------------------------------------------------
# Every layer is built from a LayerParameter message: the same text you would write in a net.
param = proto.parse(
    """
    name: "conv"  type: "Convolution"
    convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } }
""",
    "LayerParameter",
)
conv = create_layer(param, caffe.backend.get("cpu"))
y = Blob(name="y")
conv.setup([x], [y])  # check arity -> read params, make weights -> reshape
print("conv weights", conv.blobs[0].shape, "bias", conv.blobs[1].shape, "-> top", y.shape)

conv.forward([x], [y])
# The layer computed y = w * x + b; check one output against the definition of convolution.
w, b = conv.blobs[0].data, conv.blobs[1].data
padded = np.pad(x.data, ((0, 0), (0, 0), (1, 1), (1, 1)))
by_hand = (w[2] * padded[1, :, 0:3, 1:4]).sum() + b[2]
print("y[1, 2, 0, 1] =", y.data[1, 2, 0, 1], " by hand:", by_hand)
assert np.isclose(y.data[1, 2, 0, 1], by_hand, rtol=1e-5, atol=1e-6)

# -- 3. backward, and a gradient checked by finite differences --------------------------------
# Take the objective L = sum(y * g) for a fixed random g: then dL/dy = g.
g = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
y.diff[...] = g
conv.blobs[0].diff[...] = 0  # parameter diffs accumulate (the solver clears them)
conv.backward([y], [True], [x])
analytic = x.diff[0, 1, 2, 2]

eps = 1e-2
old = x.data[0, 1, 2, 2]
x.data[0, 1, 2, 2] = old + eps
conv.forward([x], [y])
plus = float((y.data * g).sum())
x.data[0, 1, 2, 2] = old - eps
conv.forward([x], [y])
minus = float((y.data * g).sum())
x.data[0, 1, 2, 2] = old
numeric = (plus - minus) / (2 * eps)
print(f"dL/dx[0,1,2,2]: backward {analytic:.5f}, finite differences {numeric:.5f}")
assert abs(analytic - numeric) < 1e-2 * max(1.0, abs(numeric))
print("lesson 1 done")
