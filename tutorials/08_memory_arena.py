# %% [markdown]
# # Lesson 8: the memory arena
#
# **You will learn** when each buffer of a training step is needed (its lifetime), how buffers
# whose lifetimes do not overlap can share the same bytes, how minicaffe places every buffer of a
# net in one allocation, what in-place layers and recomputed columns save, and how the plan is
# proved correct by poisoning every byte that is not live. **You need** lesson 2 (nets, in-place
# layers) and lesson 3 (im2col's columns).
#
# A naive engine gives every blob its own `data` and `diff` arrays for the whole run. But one
# training iteration is a fixed schedule: forward through the layers, then backward in reverse.
# A blob's data written by layer 3's forward may be dead after layer 5's backward; the diff of a
# blob exists only during backward. Arrays that are never live at the same time can live in the
# same memory, the way a compiler's register allocator reuses registers.

# %%
import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, cleanup, show

import minicaffe as caffe
from minicaffe import memory
from minicaffe.parallel import with_synthetic_data

caffe.set_random_seed(0)
print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## Five buffers by hand
# Steps 0-5: a three-layer net's forward (0, 1, 2) and backward (3, 4, 5). Five buffers with
# their sizes and the steps they must survive. Two buffers may share bytes only if their step
# intervals do not intersect. `memory.place` puts the biggest first, each at the lowest offset
# that does not collide with an already placed buffer it overlaps in time (first fit).

# %%
hand = [  # name, bytes, (first step, last step)
    ("x", 400, (0, 5)),
    ("h1", 800, (0, 4)),
    ("h2", 800, (1, 3)),
    ("dh2", 800, (3, 4)),
    ("dh1", 800, (4, 5)),
]
bufs = [memory.Buffer(n, "activations", nbytes // 4, np.float32, [iv], attach=None) for n, nbytes, iv in hand]
size = memory.place(bufs, align=16)
for b in bufs:
    print(f"  {b.name:4s} {b.nbytes:4d} bytes live {b.intervals[0]} at offset {b.offset}")
naive = sum(b.nbytes for b in bufs)
peak = memory.peak_bytes(bufs, 6)
print(f"naive {naive} bytes, placed {size}, peak live {peak} (no plan can use less than the peak)")
assert size < naive and size >= peak


def gantt(ax, buffers, n_steps, colors=None, label_min=0.0):
    """Each buffer as a box: x = its live steps, y = its bytes in the arena."""
    top = max(b.offset + b.nbytes for b in buffers)
    for b in buffers:
        color = (colors or {}).get(b.category, "C0")
        for first, last in b.intervals or [(0, n_steps - 1)]:
            ax.add_patch(
                plt.Rectangle(
                    (first - 0.45, b.offset), last - first + 0.9, b.nbytes, fc=color, ec="k", lw=0.4, alpha=0.8
                )
            )
            if b.nbytes >= label_min * top:
                ax.text((first + last) / 2, b.offset + b.nbytes / 2, b.name, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.6, n_steps - 0.4)
    ax.set_ylim(0, top * 1.02)
    ax.set_xlabel("step (forward, then backward)")
    if top > 2**20:
        ax.yaxis.set_major_formatter(lambda v, _: f"{v / 2**20:.0f}")
        ax.set_ylabel("offset in the arena (MiB)")
    else:
        ax.set_ylabel("offset in the arena (bytes)")


fig, ax = plt.subplots(figsize=(6, 3.5))
gantt(ax, bufs, 6)
ax.set_title(f"five buffers in {size} bytes instead of {naive}")
show(fig, "08_hand_plan")

# %% [markdown]
# Read the picture: two boxes may share rows (bytes) only where they do not overlap in x
# (steps). `h1` and `h2` are live together, so they are stacked; the diffs arrive in backward
# and reuse the rows of what has died by then. That is the whole invariant the planner keeps.
#
# ## LeNet's real plan
# `memory.plan_net(net)` runs one iteration to learn every buffer's uses (blob data, blob diffs,
# layers' scratch such as im2col's columns and pooling's argmax masks), computes lifetimes, and
# places them. The rules for what is live when are in `minicaffe/memory/lifetimes.py`: a layer
# declares what its backward reads, so for example an InnerProduct's output data dies as soon as
# the next layer's forward is done with it. The data here are synthetic (the plan does not
# depend on the values).

# %%
import os

from _course import ROOT

from minicaffe.net import load_net_param


def build(name, batch):
    """A training net of nets/ with synthetic data of the same shape and the given batch."""
    p = with_synthetic_data(load_net_param(os.path.join(ROOT, "nets", name)))
    for lp in p.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = batch
    return caffe.Net(p, caffe.TRAIN)


def lenet(batch):
    return build("lenet_train_test.prototxt", batch)


net = lenet(64)
plan = memory.plan_net(net, params=False)
print(
    f"{len(plan.buffers)} buffers over {plan.n_steps} steps; naive {plan.naive / 2**20:.2f} MiB, planned {plan.size / 2**20:.2f} MiB, peak live {plan.peak / 2**20:.2f} MiB"
)
for cat, (count, nbytes) in sorted(plan.by_category().items()):
    print(f"  {cat:18s} {count:3d} buffers {nbytes / 2**20:7.2f} MiB")
assert plan.size < plan.naive and plan.size >= plan.peak

# %% [markdown]
# The Gantt chart of the plan: every box is one buffer, placed at its offset and stretched over
# the steps it is live. The planned arena is the height of the picture; the naive total would
# stack every box on its own rows.

# %%
cat_colors = {"activations": "#4c72b0", "activation diffs": "#dd8452", "layer scratch": "#55a868"}
fig, ax = plt.subplots(figsize=(10, 5))
gantt(ax, [b for b in plan.buffers if b.intervals is not None], plan.n_steps, cat_colors, label_min=0.04)
for i in range(len(net.layer_dict)):
    ax.axvline(i, color="0.9", lw=0.5, zorder=0)
ax.set_xticks(
    range(plan.n_steps),
    [f"{n} fwd" for n in net.layer_dict] + [f"{n} bwd" for n in reversed(net.layer_dict)],
    rotation=90,
    fontsize=6,
)
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, fc=c) for c in cat_colors.values()],
    labels=list(cat_colors),
    fontsize=8,
    loc="upper right",
)
ax.set_title(
    f"LeNet, batch 64: buffer lifetimes placed in one arena ({plan.size / 2**20:.2f} MiB vs {plan.naive / 2**20:.2f} MiB naive; persistent buffers not drawn)"
)
show(fig, "08_lenet_gantt")

# %% [markdown]
# The two big green boxes are the im2col columns of conv1 and conv2, kept from each layer's
# forward to its backward: at batch 64 they are most of LeNet's memory. The diffs (orange)
# appear only in the backward half and reuse rows the forward activations have given up.
#
# ## In place and recomputed columns
# ReLU in place (`bottom: "ip1" top: "ip1"`) is one Blob, so one buffer: LeNet's `ip1` data
# has no second copy. Convolutions keep their im2col columns from forward to backward (lesson 3);
# with `recompute=True` they compute them again in backward, so the columns live only inside one
# call and one region serves every convolution. We compare three nets, naive vs planned vs
# planned with recompute.

# %%
relu_inplace = [b.name for b in plan.buffers if "ip1" in b.name]
print("buffers holding ip1:", relu_inplace)
assert any(b.name == "ip1.data" for b in plan.buffers)


def cifar(batch):
    return build("cifar10_quick_train_test.prototxt", batch)


batch = 16 if QUICK else 100
rows = {}
for label, make, b in (("LeNet", lenet, 64), ("CIFAR-10 quick", cifar, batch)):
    kept = memory.plan_net(make(b), params=False)
    rec = memory.plan_net(make(b), params=False, recompute=True)
    rows[f"{label} (batch {b})"] = (kept.naive, kept.size, rec.size, rec.peak)
    print(
        f"{label:15s} naive {kept.naive / 2**20:7.2f} MiB  planned {kept.size / 2**20:7.2f}  with recompute {rec.size / 2**20:7.2f}  ({kept.naive / rec.size:.1f}x less than naive)"
    )
    assert rec.size <= kept.size < kept.naive

fig, ax = plt.subplots(figsize=(8, 3))
labels = list(rows)
for j, (what, color) in enumerate((("naive", "0.6"), ("planned", "C0"), ("planned + recompute", "C2"))):
    ax.barh(
        np.arange(len(labels)) + 0.27 * j, [r[j] / 2**20 for r in rows.values()], height=0.27, color=color, label=what
    )
ax.set_yticks(np.arange(len(labels)) + 0.27, labels)
ax.invert_yaxis()
ax.set_xlabel("MiB of activations, their diffs and layer scratch")
ax.legend(fontsize=8)
ax.set_title("one allocation per buffer vs one planned arena")
show(fig, "08_planned_vs_naive")

# %% [markdown]
# ## Proving the plan: poison
# A plan that lets two live buffers share bytes would corrupt training silently. The check is
# brutal: move the net into its arena, and before every step fill every byte that no buffer
# needs at that step with 0xFF (a NaN as a float). If any layer read a buffer the plan thought
# dead, the loss would be NaN or differ from an unplanned run.

# %%
caffe.set_random_seed(3)
reference_net = lenet(64)
checked_net = lenet(64)
checked_net.share_with(reference_net)  # same weights
loss_ref = float(reference_net.forward_backward())
plan = memory.plan_memory(checked_net, params=False)
loss_poisoned = float(plan.forward_backward_poisoned())
print(f"loss unplanned {loss_ref:.6f}, planned with every dead byte poisoned {loss_poisoned:.6f}")
assert np.isfinite(loss_poisoned) and abs(loss_poisoned - loss_ref) < 1e-4 * abs(loss_ref)

# %% [markdown]
# ## Exercises
# 1. Write `place_first_fit(sizes, intervals)`: return an offset per buffer such that no two
#    buffers live at a common step share a byte, placing biggest first at the lowest offset that
#    fits. Check: `python -m tutorials.check 08.1`
# 2. Write `peak_live(sizes, intervals, n_steps)`: the most bytes live at one step, the lower
#    bound of any plan. Check: `python -m tutorials.check 08.2`
# 3. (thought) First fit by size is a heuristic: find a set of lifetimes where it needs more than
#    the peak. Why does the planner not search for the optimum?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 8 done")
