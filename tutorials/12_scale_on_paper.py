# %% [markdown]
# # Lesson 12: scale on paper, the cluster simulator
#
# **You will learn** how to predict the speedup of data-parallel training on clusters you do not
# have: per-layer compute times from a stated GPU model, per-layer synchronization costs from
# Poseidon's rule and a link's bandwidth and latency, and the schedule (with or without wait-free
# backprop) run as an event model; then how speedup curves of AlexNet and VGG-16 bend with the
# number of nodes and the network, set against Poseidon's published results. **You need**
# lessons 10 and 11 (parameter servers, the cost rule, WFBP).
#
# Lesson 11 measured two nodes on one machine. Sixteen GPUs on 10 GbE are not on this machine,
# but their arithmetic is simple enough to write down, and every assumption can be stated.

# %%
import os

import matplotlib.pyplot as plt
from _course import QUICK, ROOT, cleanup, show

from minicaffe.dist import simulate

print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## The model, with small numbers
# Three layers, times in milliseconds: a convolution (little to send), and two fully connected
# layers (much to send). One node computes forward 0, 1, 2 then backward 2, 1, 0; a
# communication thread syncs one layer at a time. A layer's sync costs `latency x round trips +
# (bytes / 2) / bandwidth` (sent and received bytes move at once on a full-duplex link).

# %%
toy = [
    simulate.Layer("conv", forward=0.010, backward=0.020, count=50_000),
    simulate.Layer("fc1", forward=0.002, backward=0.004, count=4_000_000, m=1000, n=4000, k=32),
    simulate.Layer("fc2", forward=0.001, backward=0.002, count=1_000_000, m=1000, n=1000, k=32),
]
link = simulate.Link(simulate.parse_rate("10gbit"), 50e-6)
print(f"one node: {simulate.one_node_time(toy) * 1e3:.1f} ms per iteration")
for comm in ("ps", "hybrid"):
    for wfbp in (False, True):
        s, r = simulate.speedup(toy, 8, link, comm, wfbp)
        print(
            f"  8 nodes, {comm:6s} WFBP {'on ' if wfbp else 'off'}: {r.period * 1e3:6.2f} ms per iteration, {r.bytes / 2**20:6.1f} MiB per node, speedup {s:.2f}x"
        )
s_plain, _ = simulate.speedup(toy, 8, link, "ps", False)
s_best, _ = simulate.speedup(toy, 8, link, "hybrid", True)
assert s_best >= s_plain

# %% [markdown]
# Speedup is weak scaling, as Poseidon reports it: each node keeps its own batch, so P nodes
# process P times the images; speedup = `P x (one node's time per iteration) / (P nodes' time
# per iteration)`. Perfect is P.
#
# ## Real nets on a stated GPU
# For AlexNet (CaffeNet's deploy net) and VGG-16, the simulator counts each layer's FLOPs from
# the prototxt's shapes and divides by a GPU's sustained rate: Poseidon's cluster had one
# Maxwell GTX Titan X per node, modelled as 6.6 TFLOP/s at 50% efficiency, 336 GB/s. These are
# assumptions, printed, not measurements.

# %%
gpu = simulate.TITAN_X
print(gpu)
nets = {"AlexNet": ("caffenet_deploy.prototxt", 256), "VGG-16": ("vgg16_deploy.prototxt", 32)}
models = {}
for label, (fname, batch) in nets.items():
    layers = simulate.layers_from_gpu_model(os.path.join(ROOT, "nets", fname), batch, gpu)
    models[label] = layers
    params = sum(l.count for l in layers)
    fc = sum(l.count for l in layers if l.fc)
    t1 = simulate.one_node_time(layers)
    print(
        f"{label}: {params / 1e6:.1f}M parameters ({fc / params:.0%} in FC layers), batch {batch}: {t1 * 1e3:.0f} ms per iteration on one GPU"
    )

# %% [markdown]
# ## Speedup curves
# Every mode (PS, SFB, hybrid; WFBP off and on) over 1 to 32 nodes, on 1 GbE and 10 GbE with 50
# microseconds of latency.

# %%
nodes = [1, 2, 4, 8, 16] if QUICK else [1, 2, 4, 8, 16, 32]
links = {"1 GbE": "1gbit", "10 GbE": "10gbit"}
tables = {}
for label, layers in models.items():
    for lname, rate in links.items():
        tables[(label, lname)] = simulate.speedup_table(layers, nodes, simulate.Link(simulate.parse_rate(rate), 50e-6))

fig, axes = plt.subplots(len(models), len(links), figsize=(10, 7), sharex=True)
for (label, lname), ax in zip(tables, axes.ravel()):
    table = tables[(label, lname)]
    ax.plot(nodes, nodes, "k:", lw=1, label="perfect")
    for (comm, wfbp), rows in table.items():
        ax.plot(
            [p for p, _, _ in rows],
            [s for _, s, _ in rows],
            "o-" if wfbp else "s--",
            ms=3,
            label=simulate.mode_label(comm, wfbp),
        )
    ax.set_title(f"{label}, {lname}", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_ylabel("speedup")
for ax in axes[-1]:
    ax.set_xlabel("nodes")
axes[0, 0].legend(fontsize=6, ncol=2)
fig.tight_layout()
show(fig, "12_speedups")

# %%
for (label, lname), table in tables.items():
    best, base = table[("hybrid", True)][-1], table[("ps", False)][-1]
    print(f"{label:8s} {lname:6s}: on {best[0]} nodes, PS without WFBP {base[1]:5.1f}x, hybrid + WFBP {best[1]:5.1f}x")
    assert best[1] >= base[1] * 0.999
print(
    "published: AlexNet 4.5x on 8 nodes over Ethernet (arXiv 1512.06216); VGG19-22K 15.5x on 16 nodes over 10 GbE (ATC'17)"
)
speed = {key: {p: sp for p, sp, _ in t[("hybrid", True)]} for key, t in tables.items()}
plain = {key: {p: sp for p, sp, _ in t[("ps", False)]} for key, t in tables.items()}
top = max(nodes)
assert speed[("VGG-16", "1 GbE")][top] > 3 * plain[("VGG-16", "1 GbE")][top], "hybrid + WFBP rescues VGG-16 on 1 GbE"
for net_label in models:
    assert speed[(net_label, "10 GbE")][top] > speed[(net_label, "1 GbE")][top]
alex8 = dict((p, s) for p, s, _ in tables[("AlexNet", "10 GbE")][("hybrid", True)])[8]
print(f"this model, AlexNet on 8 nodes, 10 GbE, hybrid + WFBP: {alex8:.1f}x")

# %% [markdown]
# What to read from the curves: on 1 GbE a plain parameter server stops scaling after a few
# nodes for both nets, because their FC layers' gradients are hundreds of megabytes per
# iteration. For VGG-16, whose long compute gives the traffic something to hide behind, hybrid
# communication and WFBP recover much of the loss; AlexNet's iteration is too short to hide its
# traffic on 1 GbE in any mode. On 10 GbE both nets scale much further. A speedup can even pass
# P slightly: one node applies the whole update itself, while each of P nodes applies 1/P of it.
#
# The model is optimistic in known ways: it assumes perfect use of the link and no stragglers,
# and its GPU times are a FLOP count over a stated efficiency. Where it disagrees with a measured
# cluster, the assumption to suspect first is one of those, named in the model.
#
# ## Exercises
# 1. Write `speedup(t_one, t_period, P)`: weak-scaling speedup from one node's time per
#    iteration and P nodes' time per iteration. Check: `python -m tutorials.check 12.1`
# 2. Write `sync_seconds(nbytes, rounds, bandwidth, latency)`: the time of one layer's sync in
#    the model above. Check: `python -m tutorials.check 12.2`
# 3. (thought) The model says hybrid + WFBP on 10 GbE scales VGG-16 well to 16 nodes. Name
#    three things a real cluster adds that the model leaves out, and which way each moves the curve.
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 12 done")
