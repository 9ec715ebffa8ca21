"""Lesson 2: a net from Caffe's prototxt.

A Net is built from a NetParameter: it keeps the layers of the requested phase, connects each
bottom to the blob an earlier layer produced, computes in place where a top has its bottom's
name, inserts Split layers where a blob feeds several layers, and decides which layers need
backward.
"""

import numpy as np

import minicaffe as caffe
from minicaffe import proto

caffe.set_random_seed(0)
NET = """
name: "lesson2"
input: "data"   input_shape { dim: 4 dim: 1 dim: 12 dim: 12 }
input: "label"  input_shape { dim: 4 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }     # in place
layer { name: "ip" type: "InnerProduct" bottom: "pool1" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
"""

for phase in (caffe.TRAIN, caffe.TEST):
    net = caffe.Net(proto.parse(NET, "NetParameter"), phase)
    print(f"{phase}: layers {list(net.layer_dict)}")
# In TEST, "ip" and "label" each feed two layers (loss and acc): Caffe inserts Split layers so
# each consumer gets its own diff.  TRAIN has no Accuracy layer, so no split.

net = caffe.Net(proto.parse(NET, "NetParameter"), caffe.TRAIN)
for name, blobs in net.params.items():
    print(f"params of {name}: {[b.shape for b in blobs]}")
print("need backward:", dict(zip(net.layer_dict, net.layer_need_backward)))

rng = np.random.default_rng(0)
out = net.forward(data=rng.random((4, 1, 12, 12)), label=np.array([0, 1, 2, 1]))
print("loss", float(out["loss"]))
net.backward()
print("|d loss / d conv1 weights| =", net.params["conv1"][0].asum_diff())
assert net.params["conv1"][0].asum_diff() > 0

# Weights round-trip through Caffe's binary .caffemodel format:
import os
import tempfile

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "lesson2.caffemodel")
    net.save(path)
    other = caffe.Net(proto.parse(NET, "NetParameter"), path, caffe.TEST)
    assert np.array_equal(other.params["ip"][0].data, net.params["ip"][0].data)
    print("saved and reloaded", os.path.getsize(path), "bytes")
print("lesson 2 done")
