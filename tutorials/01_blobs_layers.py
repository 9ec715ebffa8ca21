# %% [markdown]
# # Lesson 1: blobs and one layer
#
# **You will learn** what a Blob holds (values going forward, gradients coming back), what a
# Layer promises (setup, forward, backward), how to derive a layer's backward pass by hand, and
# how to check any backward pass with finite differences, the test every layer in minicaffe
# passes. **You need** Python and numpy; nothing about minicaffe yet.
#
# A network is a chain of functions. Training needs, for every number in it, the derivative of
# the loss with respect to that number. Caffe keeps both side by side: a **Blob** is a pair of
# arrays of one shape, `data` (the values) and `diff` (d loss / d value).

# %%
import numpy as np
from _course import QUICK, cleanup, show

import minicaffe as caffe
from minicaffe import proto
from minicaffe.blob import Blob
from minicaffe.layer import create_layer

caffe.set_random_seed(0)
np.set_printoptions(precision=4, suppress=True)
print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## A blob, with small numbers
# A blob of shape (2, 3): two samples of three features. `data` and `diff` are numpy arrays you
# can read and write in place; `count` is the number of elements.

# %%
x = Blob((2, 3), dtype=np.float64, name="x")
x.data[...] = [[1, 2, 3], [4, 5, 6]]
print("x.data =\n", x.data)
print("x.diff =\n", x.diff, "  (no gradient yet)")
print("shape", x.shape, "count", x.count)
assert x.count == 6 and x.data.shape == x.diff.shape

# %% [markdown]
# ## One layer: InnerProduct, forward by hand
# A layer is built from the same text you write in a net file (Caffe's prototxt). An
# InnerProduct layer with two outputs computes `y = x W^T + b`, with `W` of shape (2, 3).
# `setup` checks the number of inputs, creates and fills the weights, and shapes the output.
# We overwrite the random weights with small integers so the arithmetic can be followed.

# %%
ip_param = proto.parse(
    'name: "ip" type: "InnerProduct" inner_product_param { num_output: 2 }',
    "LayerParameter",
)
cpu = caffe.backend.get("cpu")
ip = create_layer(ip_param, cpu, dtype=np.float64)
y = Blob(dtype=np.float64, name="y")
ip.setup([x], [y])
W, b = ip.blobs
W.data[...] = [[1, 0, -1], [0, 1, 0]]
b.data[...] = [10, 20]
ip.forward([x], [y])
print("W =\n", W.data, "\nb =", b.data)
print("y = x W^T + b =\n", y.data)
assert np.array_equal(y.data, x.data @ W.data.T + b.data)

# %% [markdown]
# ## Backward by hand
# Suppose the loss is `L = sum(y * g)` for some fixed array `g`. Then `dL/dy = g`, and the chain
# rule gives the three gradients an InnerProduct must produce:
#
# - `dL/dx = g W` (each input feeds every output through one weight),
# - `dL/dW = g^T x` (summed over the batch),
# - `dL/db = sum of g over the batch`.
#
# In Caffe the top's `diff` holds `dL/dy` when `backward` is called; the layer writes the
# bottom's `diff` and **adds** into its parameters' diffs (the solver clears them each step,
# so a parameter used twice gets the sum of both gradients).

# %%
g = np.array([[1.0, 0.0], [0.0, 2.0]])
y.diff[...] = g
for p in ip.blobs:
    p.diff[...] = 0
ip.backward([y], [True], [x])
print("dL/dx =\n", x.diff, "\nby hand g W =\n", g @ W.data)
print("dL/dW =\n", W.diff, "\nby hand g^T x =\n", g.T @ x.data)
print("dL/db =", b.diff, " by hand:", g.sum(0))
assert np.allclose(x.diff, g @ W.data) and np.allclose(W.diff, g.T @ x.data) and np.allclose(b.diff, g.sum(0))

# %% [markdown]
# Backward once more without clearing: the parameter diffs double, the input diff does not.
# That is Caffe's rule (parameters accumulate, bottoms are overwritten).

# %%
ip.backward([y], [True], [x])
print("after a second backward, dL/dW =\n", W.diff)
assert np.allclose(W.diff, 2 * g.T @ x.data) and np.allclose(x.diff, g @ W.data)

# %% [markdown]
# ## Checking a gradient without knowing it: finite differences
# For any scalar function `f`, `(f(v + h) - f(v - h)) / 2h` approaches `df/dv` with an error
# of order `h^2`. It needs two forward passes per number, so it is far too slow to train with,
# but it checks a hand-written backward pass against nothing but the forward pass.
#
# We do it for a convolution layer (the layer of lesson 3): 4 filters of 3x3 over a
# 2-channel 5x5 image, padding 1, in float64 so the check is sharp.

# %%
conv_param = proto.parse(
    """name: "conv" type: "Convolution"
       convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } }""",
    "LayerParameter",
)
rng = np.random.default_rng(0)
batch = 1 if QUICK else 2
cx = Blob((batch, 2, 5, 5), dtype=np.float64, name="x")
cx.data[...] = rng.standard_normal(cx.shape)
conv = create_layer(conv_param, cpu, dtype=np.float64)
cy = Blob(dtype=np.float64, name="y")
conv.setup([cx], [cy])
conv.forward([cx], [cy])
print("x", cx.shape, "-> conv weights", conv.blobs[0].shape, "-> y", cy.shape)

# one output by the definition of convolution: a weighted sum over a 3x3 window of each channel
w, bias = conv.blobs[0].data, conv.blobs[1].data
padded = np.pad(cx.data, ((0, 0), (0, 0), (1, 1), (1, 1)))
by_hand = (w[2] * padded[0, :, 0:3, 1:4]).sum() + bias[2]
print("y[0, 2, 0, 1] =", cy.data[0, 2, 0, 1], " by the definition:", by_hand)
assert np.isclose(cy.data[0, 2, 0, 1], by_hand)

# %% [markdown]
# Now every element of the input and of the weights, analytic against numeric. The objective
# is again `L = sum(y * g)` with a random `g`.

# %%
g = rng.standard_normal(cy.shape)


def loss():
    conv.forward([cx], [cy])
    return float((cy.data * g).sum())


cy.diff[...] = g
conv.blobs[0].diff[...] = 0
conv.blobs[1].diff[...] = 0
conv.backward([cy], [True], [cx])
analytic = {"x": cx.diff.copy(), "weights": conv.blobs[0].diff.copy()}


def numeric_gradient(f, v, h=1e-5):
    """Central differences of f() with respect to every element of array v (changed in place)."""
    grad = np.zeros_like(v)
    for i in np.ndindex(v.shape):
        old = v[i]
        v[i] = old + h
        plus = f()
        v[i] = old - h
        minus = f()
        v[i] = old
        grad[i] = (plus - minus) / (2 * h)
    return grad


numeric = {"x": numeric_gradient(loss, cx.data), "weights": numeric_gradient(loss, conv.blobs[0].data)}
for k in analytic:
    err = np.abs(analytic[k] - numeric[k]).max()
    print(f"d L / d {k:8s}: {analytic[k].size:4d} numbers, largest |analytic - numeric| = {err:.2e}")
    assert err < 1e-7 * max(1.0, np.abs(numeric[k]).max())

# %% [markdown]
# The figure plots every analytic derivative against its numeric estimate: all points should
# lie on the diagonal. A wrong backward pass shows up as a cloud off it: the faint points are
# the weight gradient with its 3x3 taps reversed, an indexing bug of exactly the kind this
# check exists to catch.

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 4.5))
for k, marker in (("x", "o"), ("weights", "s")):
    ax.scatter(numeric[k].ravel(), analytic[k].ravel(), s=14, marker=marker, label=f"d L / d {k}")
wrong = numeric["weights"][:, :, ::-1, ::-1]  # taps reversed: an indexing bug
ax.scatter(numeric["weights"].ravel(), wrong.ravel(), s=8, alpha=0.4, label="a wrong backward (taps reversed)")
lim = np.abs(numeric["weights"]).max() * 1.1
ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
ax.set_xlabel("numeric (finite differences)")
ax.set_ylabel("analytic (backward)")
ax.set_title("gradient check of a 3x3 convolution")
ax.legend(fontsize=8)
show(fig, "01_gradient_check")

# %% [markdown]
# ## What you saw
# - A Blob is `data` + `diff`; a layer's `backward` turns the top's diff into the bottom's diff
#   and *accumulates* its parameters' diffs.
# - Each backward formula follows from the chain rule; finite differences check it using
#   nothing but the forward pass. minicaffe's tests (`tests/gradient_check.py`) do exactly
#   this for every layer on every backend.
#
# ## Exercises
# 1. Write `inner_product_backward(x, w, dy)` returning `(dx, dw, db)` for `y = x w^T + b`,
#    in `tutorials/exercises/ex01.py`. Check it: `python -m tutorials.check 01.1`
# 2. Write `numeric_gradient(f, v, h)` (central differences, as above, but without looking) and
#    `relative_error(a, b)` as Caffe's gradient checker defines it. Check: `python -m tutorials.check 01.2`
# 3. (thought) Why does the finite-difference check use float64 and `h = 1e-5`? What goes wrong
#    with float32 and `h = 1e-5`, and with float64 and `h = 1e-12`?
# 4. (thought) Why must parameter diffs accumulate rather than be overwritten? Name two
#    features of Caffe that would break otherwise.
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 1 done")
