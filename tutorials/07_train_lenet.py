# %% [markdown]
# # Lesson 7: training LeNet
#
# **You will learn** what a solver does each iteration, how learning-rate policies shape a run,
# how six update rules compare on the same net, what LeNet's first layer learns (its filters and
# feature maps, Caffe's classic pictures), and how a snapshot lets a run stop and continue bit
# for bit. **You need** lesson 2 (nets from prototxt) and lesson 1 (gradients).
#
# A solver prototxt names the net and the optimization: learning rate and its policy, momentum,
# weight decay, when to test and to snapshot. Each iteration the solver runs forward and backward
# on one batch, then turns the gradients into an update of the weights.
#
# Full mode trains on real MNIST (fetched and checked on first use, see the README's "Data");
# quick mode uses a small synthetic set of the same shape, so the tests run without downloading.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, ROOT, cleanup, scratch, show

import minicaffe as caffe
from minicaffe import data, proto
from minicaffe.solvers import load_solver_param, lr_policy

caffe.set_random_seed(0)
SOLVER = os.path.join(ROOT, "nets", "lenet_solver.prototxt")
BATCH = 16 if QUICK else 64  # LeNet's batch is 64; quick mode trains on smaller ones
if QUICK:  # a learnable synthetic set with MNIST's shape, under MNIST's names: 768 train, 256 test
    ds = data.synthetic_dataset((1, 28, 28), num_classes=10, count=1024, seed=1)
    data.register_dataset("mnist_train", ds.images[:768], ds.labels[:768])
    data.register_dataset("mnist_test", ds.images[768:], ds.labels[768:])
print("quick mode: synthetic digits, batch 16" if QUICK else "full mode: MNIST, batch 64")

# %% [markdown]
# ## Learning-rate policies
# The rate at iteration `it` comes from `lr_policy`. LeNet's solver uses `inv`:
# `base_lr * (1 + gamma * it) ^ (-power)`, a slow decay. The others are Caffe's, with the
# settings written in each label.

# %%
policies = {
    "fixed": "",
    "step": "gamma: 0.5 stepsize: 2500",
    "multistep": "gamma: 0.3 stepvalue: 3000 stepvalue: 6000 stepvalue: 8000",
    "exp": "gamma: 0.9998",
    "inv": "gamma: 0.0001 power: 0.75",
    "poly": "power: 2 max_iter: 10000",
    "sigmoid": "gamma: -0.002 stepsize: 5000",
}
its = np.arange(0, 10001, 50)
fig, ax = plt.subplots(figsize=(8, 4))
for name, extra in policies.items():
    p = proto.parse(f'base_lr: 0.01 lr_policy: "{name}" {extra}', "SolverParameter")
    lr_policy.check(p)
    step, rates = 0, []
    for it in its:
        step = lr_policy.advance_multistep(p, it, step)
        rates.append(lr_policy.learning_rate(p, it, step))
    ax.plot(its, rates, label=f"{name}  {extra}")
    print(f"{name:9s} lr at 0, 5000, 10000: {rates[0]:.5f} {rates[100]:.5f} {rates[-1]:.5f}")
ax.set_xlabel("iteration")
ax.set_ylabel("learning rate")
ax.legend(fontsize=7)
ax.set_title("Caffe's learning-rate policies (base_lr 0.01)")
show(fig, "07_lr_policies")

# %% [markdown]
# ## Six update rules on one net
# The same LeNet, the same batches (same seed), six solvers with the settings of Caffe's MNIST
# examples. SGD keeps a momentum `h = m h + lr g; w -= h`; Nesterov looks ahead along the
# momentum; AdaGrad, RMSProp and AdaDelta scale each weight's step by its gradients' history;
# Adam keeps running means of the gradient and of its square.

# %%
RULES = {
    "SGD": "",
    "Nesterov": "",
    "AdaGrad": 'momentum: 0 lr_policy: "fixed"',
    "RMSProp": "base_lr: 0.001 momentum: 0 rms_decay: 0.98",
    "AdaDelta": 'base_lr: 1.0 momentum: 0.95 delta: 1e-6 lr_policy: "fixed"',
    "Adam": 'base_lr: 0.001 momentum: 0.9 momentum2: 0.999 delta: 1e-8 lr_policy: "fixed"',
}
work = scratch("lesson7")


def make_solver(rule="SGD", overrides=""):
    param, base = load_solver_param(SOLVER)
    if QUICK:  # the net inline, with a smaller training batch
        net = proto.parse_file(os.path.join(base, param.net), "NetParameter")
        next(
            lp for lp in net.layer if lp.type == "Data" and lp.include[0].phase == "TRAIN"
        ).data_param.batch_size = BATCH
        param.clear("net")
        param.net_param = net
    for key, value in proto.parse(overrides, "SolverParameter").fields():
        setattr(param, key, value)
    param.type = rule
    param.test_interval = 0
    param.display = 0
    param.snapshot_prefix = os.path.join(work, "lenet")
    if QUICK:
        param.test_iter[0] = 4
    return caffe.get_solver(param, base_dir=base, log=lambda m: None)


def train(solver, iters):
    """Step one iteration at a time and read the loss the net just computed."""
    losses = []
    for _ in range(iters):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    return losses


iters = 25 if QUICK else 300
curves = {}
for rule, extra in RULES.items():
    caffe.set_random_seed(1)
    curves[rule] = train(make_solver(rule, extra), iters)
    print(f"{rule:9s} loss: first 10 {np.mean(curves[rule][:10]):.3f}, last 10 {np.mean(curves[rule][-10:]):.3f}")
    assert np.mean(curves[rule][-10:]) < np.mean(curves[rule][:10]), f"{rule} did not learn"

# %%
fig, ax = plt.subplots(figsize=(8, 4))
w = 5 if QUICK else 20
for rule, losses in curves.items():
    smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
    ax.plot(np.arange(w - 1, len(losses)), smooth, label=rule)
ax.set_xlabel("iteration")
ax.set_ylabel(f"training loss (mean of {w})")
ax.set_yscale("log")
ax.legend()
ax.set_title("LeNet, six solvers, same batches")
show(fig, "07_solvers")

# %% [markdown]
# ## A real run, with snapshots and an exact resume
# Now LeNet's own solver (SGD, momentum 0.9, `inv` policy). Halfway we write a snapshot: the
# weights (Caffe's `.caffemodel`) and the solver state (momentum history, iteration, random
# generator and data reader positions). A fresh solver restored from that state must repeat the
# second half **exactly**: same losses to the last bit.

# %%
total = 40 if QUICK else 2000
caffe.set_random_seed(1)
solver = make_solver()
first = train(solver, total // 2)
weights, state = solver.snapshot()
second = train(solver, total - total // 2)
print("snapshot:", os.path.basename(weights), os.path.getsize(weights), "bytes;", os.path.basename(state))

again = make_solver()
again.restore(state)
resumed = train(again, total - total // 2)
print("the resumed run repeats the losses exactly:", resumed == second)
assert resumed == second
result = solver.test(0)
print(f"after {total} iterations: test accuracy {result['accuracy']:.4f}, test loss {result['loss']:.4f}")
assert result["accuracy"] > (0.5 if QUICK else 0.97)

# %% [markdown]
# ## What the first layer learned
# conv1 has 20 filters of 5x5 over the one input channel, shown as images (as in Caffe's
# `filter_visualization` notebook): red weights where a filter wants ink, blue where it wants
# background. At 5x5 and after a few thousand iterations they look rough; what they do shows
# better in the 20 feature maps of one test digit below: each map is the digit seen through one
# filter, and in full mode on MNIST most of them light up on one kind of edge (the top or the
# bottom of a horizontal stroke, the left or the right of a vertical one). In quick mode the
# "digits" are synthetic patterns, so the pictures are only noise; run the lesson in full mode.

# %%
net = solver.test_nets[0]
net.forward()
filters = solver.net.params["conv1"][0].data[:, 0]
digit = net.blobs["data"].data[0, 0]
maps = net.blobs["conv1"].data[0]
fig = plt.figure(figsize=(9, 4))
grid = fig.add_gridspec(4, 9)
ax = fig.add_subplot(grid[:, :4])
ax.imshow(digit, cmap="gray")
ax.set_title(f"input (label {int(net.blobs['label'].data[0])})")
ax.axis("off")
for i in range(20):
    a = fig.add_subplot(grid[i // 5, 4 + i % 5])
    a.axis("off")
    a.imshow(filters[i], cmap="RdBu_r", vmin=-np.abs(filters).max(), vmax=np.abs(filters).max())
fig.suptitle("conv1's 20 learned 5x5 filters")
show(fig, "07_conv1_filters")

fig, axes = plt.subplots(2, 10, figsize=(12, 2.8))
for i, a in enumerate(axes.ravel()):
    a.imshow(maps[i], cmap="gray")
    a.axis("off")
fig.suptitle("conv1's 20 feature maps of the digit (24 x 24 each)")
show(fig, "07_conv1_maps")
assert filters.shape == (20, 5, 5) and maps.shape == (20, 24, 24)

# %% [markdown]
# ## Exercises
# 1. Write `learning_rate(policy, base_lr, it, gamma, power, stepsize, max_iter)` for the
#    policies fixed, step, exp, inv and poly. Check: `python -m tutorials.check 07.1`
# 2. Write `sgd_momentum_step(w, g, h, lr, momentum, weight_decay)`, Caffe's SGD update with L2
#    weight decay, returning the new `(w, h)`. Check: `python -m tutorials.check 07.2`
# 3. (thought) The snapshot stores more than the weights. List what the resume needs to repeat
#    the run bit for bit, and what goes wrong without each piece.
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 7 done")
