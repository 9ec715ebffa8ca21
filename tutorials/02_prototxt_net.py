# %% [markdown]
# # Lesson 2: a net from Caffe's prototxt
#
# **You will learn** how a Net is built from a text description: how layers are kept or dropped
# by phase, how each bottom finds the blob an earlier layer produced, why Caffe inserts Split
# layers, what "in place" means, how two layers share one set of weights, and how to draw the
# graph. **You need** lesson 1 (blobs, layers, forward and backward).
#
# Caffe describes a network in the protobuf text format ("prototxt"): a list of `layer { ... }`
# blocks, each naming its `bottom` blobs (inputs) and `top` blobs (outputs). The net is the
# graph those names make.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
from _course import cleanup, scratch, show

import minicaffe as caffe
from minicaffe import proto

caffe.set_random_seed(0)

NET = """
name: "lesson2"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 1 dim: 12 dim: 12 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "ip" type: "InnerProduct" bottom: "pool1" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
"""

# %% [markdown]
# ## Parsing: text to a message
# `proto.parse` reads the text into a message that behaves like a protobuf object; unset fields
# read as their defaults. An error in the text names the line and column.

# %%
param = proto.parse(NET, "NetParameter")
print("net", param.name, "with", len(param.layer), "layers:", [lp.name for lp in param.layer])
print(
    "conv1's kernel_size:",
    param.layer[0].convolution_param.kernel_size,
    " stride (unset):",
    param.layer[0].convolution_param.stride,
)
try:
    proto.parse('layer { name: "x" type: "ReLU" bottum: "data" }', "NetParameter", "typo.prototxt")
except caffe.errors.PrototxtError as e:
    print("a typo is caught:", str(e).split(" Known fields")[0])

# %% [markdown]
# ## Phases, splits and in-place layers
# A layer with `include { phase: TEST }` exists only in the test net. In the TEST net, the blobs
# `ip` and `label` are each read by two layers (loss and accuracy). Each reader gets its own
# copy through an inserted **Split** layer, because in backward each reader writes a gradient
# into its bottom's diff: one shared diff would be overwritten, while a Split sums its tops'
# diffs into its bottom's. The ReLU names `pool1` as bottom and top: it works **in place**,
# overwriting its input (no new memory).

# %%
nets = {}
for phase in (caffe.TRAIN, caffe.TEST):
    net = nets[phase] = caffe.Net(param, phase)
    print(f"{phase}:")
    for name, layer in net.layer_dict.items():
        print(f"   {layer.type:16s} {name:22s} {net.bottom_names[name]} -> {net.top_names[name]}")
splits = [n for n, l in nets[caffe.TEST].layer_dict.items() if l.type == "Split"]
print("splits in TEST:", splits)
assert len(splits) == 2 and not any(l.type == "Split" for l in nets[caffe.TRAIN].layers)
assert nets[caffe.TRAIN].bottom_names["relu1"] == nets[caffe.TRAIN].top_names["relu1"] == ["pool1"]

# %% [markdown]
# ## Drawing the graph
# Caffe ships `draw_net.py`; here is the same picture drawn from the net itself: layers as
# boxes, blobs as rounded labels, one row per step of the graph. An in-place layer writes a
# new *version* of its blob (same name, same memory), drawn as a new node.

# %%
COLORS = {
    "Convolution": "#f4a582",
    "Pooling": "#92c5de",
    "InnerProduct": "#d6604d",
    "Split": "#cccccc",
    "Input": "#eeeeee",
}


def draw_net(net, ax, title=None):
    """Layers (boxes) and blob versions (rounded) of ``net``, top to bottom in build order."""
    version, depth, edges, nodes = {}, {}, [], []
    for name, layer in net.layer_dict.items():
        ins = [version[b] for b in net.bottom_names[name] if b in version]
        d = 1 + max((depth[i] for i in ins), default=-1)
        node = ("layer", name, layer.type)
        depth[node] = d
        nodes.append(node)
        edges += [(i, node) for i in ins]
        for t in net.top_names[name]:
            blob = ("blob", t, len(nodes))
            depth[blob] = d + 1
            nodes.append(blob)
            edges.append((node, blob))
            version[t] = blob
    rows, parents, pos = {}, {}, {}
    for n in nodes:
        rows.setdefault(depth[n], []).append(n)
    for a, b in edges:
        parents.setdefault(b, []).append(a)
    for d in sorted(rows):  # each node under the mean of its parents, then spread apart
        want = {n: np.mean([pos[p][0] for p in parents.get(n, [])]) if n in parents else 0.0 for n in rows[d]}
        row = sorted(rows[d], key=lambda n: want[n])
        centre = np.mean([want[n] for n in row])
        for i, n in enumerate(row):
            pos[n] = (centre + 1.8 * (i - (len(row) - 1) / 2), -d)
    for a, b in edges:
        ax.annotate(
            "", xy=pos[b], xytext=pos[a], arrowprops={"arrowstyle": "->", "color": "#555", "shrinkA": 9, "shrinkB": 9}
        )
    for n in nodes:
        x, y = pos[n]
        if n[0] == "layer":
            box = {"boxstyle": "square,pad=0.35", "fc": COLORS.get(n[2], "#fddbc7"), "ec": "#333"}
            ax.text(x, y, f"{n[1]}\n({n[2]})", ha="center", va="center", fontsize=7, bbox=box)
        else:
            box = {"boxstyle": "round,pad=0.3", "fc": "#ffffcc", "ec": "#999"}
            ax.text(x, y, n[1], ha="center", va="center", fontsize=7, bbox=box)
    xs = [x for x, _ in pos.values()]
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(-max(rows) - 0.7, 0.7)
    ax.axis("off")
    ax.set_title(title or net.name, fontsize=9)
    return len(nodes)


fig, axes = plt.subplots(1, 2, figsize=(12, 8), gridspec_kw={"width_ratios": [2, 3]})
for ax, phase in zip(axes, (caffe.TRAIN, caffe.TEST)):
    draw_net(nets[phase], ax, f"{nets[phase].name}, {phase}")
show(fig, "02_net_graph")

# %% [markdown]
# In the TEST graph, `ip` and `label` each feed a Split whose two tops go to the loss and to the
# accuracy; in TRAIN there is one reader and no split. Under `relu1`, `pool1` appears twice: the
# ReLU's output is a new version of the same blob.
#
# minicaffe also ships Caffe's drawing tool, which draws the *prototxt* (so no Splits: they
# are the Net's business) from left to right, with each layer's settings:
# `python -m minicaffe.draw_net nets/lenet_train_test.prototxt lenet.png --phase TRAIN`, or from
# Python `minicaffe.draw.draw_net(param, rankdir, ext, phase)`, which returns the image's bytes.

# %%
import io

from minicaffe import draw

png = draw.draw_net(param, rankdir="LR", ext="png", phase=caffe.TEST)
image = plt.imread(io.BytesIO(png))
fig, ax = plt.subplots(figsize=(image.shape[1] / 90, image.shape[0] / 90))
ax.imshow(image)
ax.axis("off")
show(fig, "02_draw_net")
#
# ## Parameters and which layers need backward
# Each layer with weights has parameter blobs (`net.params[name]`: weights, then bias). The net
# marks a layer as needing backward if it has something to learn or a bottom that needs a
# gradient; the input `data` needs none, so conv1 does not compute a gradient for it.

# %%
net = nets[caffe.TRAIN]
for name, blobs in net.params.items():
    print(f"params of {name:6s}: {[b.shape for b in blobs]}")
print("learnable numbers:", sum(p.count for p in net.learnable_params))
print("need backward:", dict(zip(net.layer_dict, net.layer_need_backward)))

rng = np.random.default_rng(0)
out = net.forward(data=rng.random((4, 1, 12, 12)), label=np.array([0, 1, 2, 1]))
print("loss", float(out["loss"]), "(about ln 3 =", round(np.log(3), 4), "for an untrained 3-way classifier)")
net.backward()
print("sum |d loss / d conv1 weights| =", net.params["conv1"][0].asum_diff())
assert net.params["conv1"][0].asum_diff() > 0
assert abs(float(out["loss"]) - np.log(3)) < 0.5

# %% [markdown]
# ## Shared parameters
# Two layers that give their parameters the same `param { name }` use one set of weights (a
# siamese net compares two inputs through one tower). Their data is one array, and their
# gradients add up in one diff: the accumulation rule of lesson 1 is what makes this work.

# %%
SIAMESE = """
name: "siamese"
input: "a"  input_shape { dim: 2 dim: 5 }
input: "b"  input_shape { dim: 2 dim: 5 }
layer { name: "tower_a" type: "InnerProduct" bottom: "a" top: "fa"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "tower_b" type: "InnerProduct" bottom: "b" top: "fb"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "dist" type: "EuclideanLoss" bottom: "fa" bottom: "fb" top: "dist" }
"""
sn = caffe.Net(proto.parse(SIAMESE, "NetParameter"), caffe.TRAIN)
wa, wb = sn.params["tower_a"][0], sn.params["tower_b"][0]
print("one array for both towers:", np.shares_memory(wa.data, wb.data), " learnable blobs:", len(sn.learnable_params))
x = rng.standard_normal((2, 5))
out = sn.forward(a=x, b=x)
print("same input, same weights -> distance", float(out["dist"]))
assert np.shares_memory(wa.data, wb.data) and float(out["dist"]) == 0.0

# %% [markdown]
# ## Saving and loading weights
# Weights go to Caffe's binary `.caffemodel` format (a protobuf written by minicaffe's own
# encoder) and load by layer name into any net with the same layers, here the TEST net.

# %%
d = scratch("lesson2")
path = os.path.join(d, "lesson2.caffemodel")
net.save(path)
other = caffe.Net(param, path, caffe.TEST)
assert np.array_equal(other.params["ip"][0].data, net.params["ip"][0].data)
print("saved and reloaded", os.path.getsize(path), "bytes")

# %% [markdown]
# ## Exercises
# 1. Write `split_plan(layers)`: given a list of `(name, bottoms, tops)` in order, return
#    `{(producer layer, blob): number of readers}` for every blob version read by more than one
#    layer (the splits Caffe inserts). Check: `python -m tutorials.check 02.1`
# 2. Write the prototxt `SIAMESE_MLP` in `tutorials/exercises/ex02.py`: inputs `a` and `b` of
#    shape (2, 8), each through an InnerProduct of 16 outputs and a ReLU, both towers sharing
#    weights and bias, and a `EuclideanLoss` between them. Check: `python -m tutorials.check 02.2`
# 3. (thought) In the TEST net, why does the Split of `label` exist even though no gradient
#    flows to labels? What would break if a Split's backward copied instead of summing?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 2 done")
