# %% [markdown]
# # Lesson 11: Poseidon, wait-free backprop and hybrid communication
#
# **You will learn** why a fully connected layer's gradient can travel as two thin matrices
# instead of one big one (sufficient factors), how Poseidon's cost rule chooses per layer between
# a parameter server and sufficient-factor broadcasting, why sending each layer's gradients the
# moment its backward ends hides network time behind computation (wait-free backpropagation),
# and how both look measured on real sockets. **You need** lesson 10 (a sharded parameter
# server over TCP).
#
# Poseidon (Zhang et al., USENIX ATC 2017) made Caffe and TensorFlow scale over commodity
# Ethernet with two ideas. `minicaffe/dist/poseidon.py` implements both on top of lesson 10's
# parameter server; `minicaffe/dist/cost.py` holds the rule and `simulate.py` an event model.

# %%
import os
import threading

import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, ROOT, cleanup, show

import minicaffe as caffe
from minicaffe import proto
from minicaffe.dist import cost, sfb, simulate
from minicaffe.parallel import blas, with_synthetic_data
from minicaffe.solvers import load_solver_param

# Every layer below runs as one node of a cluster does: one BLAS thread, as `python -m
# minicaffe.train --nodes 2` gives each node process on this machine. OpenBLAS's threads spin
# while they wait, and two nodes' spinning threads on two cores can make a 1 ms GEMM take 100 ms.
blas.set_threads(1)
print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## A gradient that is a sum of outer products
# An InnerProduct layer computes `y = x W^T` for a batch of K rows: W is M x N. Its weight
# gradient is `dW = u^T v`, with `u` the top diff (K x M) and `v` the bottom data (K x N): a sum
# of K outer products `u_i v_i^T`. With small numbers, K = 2 rows, M = 2 outputs, N = 3 inputs:

# %%
u = np.array([[1.0, 0.0], [0.0, 2.0]])  # d loss / d y, one row per example
v = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])  # the layer's input rows
dW = u.T @ v
print("dW = u^T v =\n", dW)
print("= u_0 v_0^T + u_1 v_1^T:", np.array_equal(dW, np.outer(u[0], v[0]) + np.outer(u[1], v[1])))
print(f"floats: dW has M*N = {dW.size}; u and v have K*(M+N) = {u.size + v.size}")
assert np.array_equal(dW, np.outer(u[0], v[0]) + np.outer(u[1], v[1]))

# %% [markdown]
# For LeNet's `ip1` (500 x 800, batch 64) the factors are 64 x (500 + 800) = 83,200 floats
# against 400,000 for the gradient. A node that receives every peer's u and v rebuilds the summed
# gradient with one GEMM. On a real net, `sfb.factors_of` reads u and v after backward, and the
# rebuilt gradient is the layer's own:


# %%
def lenet_param(batch=64):
    param, base = load_solver_param(os.path.join(ROOT, "nets", "lenet_solver.prototxt"))
    net = with_synthetic_data(proto.parse_file(os.path.join(base, param.net), "NetParameter"), count=512)
    for lp in net.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = batch
    return param, base, net


caffe.set_random_seed(0)
_, _, net_param = lenet_param()
net = caffe.Net(net_param, caffe.TRAIN)
net.clear_param_diffs()
net.forward_backward()
i_ip1 = list(net.layer_dict).index("ip1")
f = sfb.factors_of(net, i_ip1)
rebuilt = np.empty(net.params["ip1"][0].shape, np.float32)
sfb.rebuild(f, rebuilt)
err = np.abs(rebuilt - net.params["ip1"][0].diff).max()
print(
    f"ip1: u {f.u.shape}, v {f.v.shape}: {f.floats:,} floats vs {rebuilt.size:,}; rebuilt vs backward max error {err:.1e}"
)
assert err < 1e-5 * max(1.0, float(np.abs(rebuilt).max()))

# %% [markdown]
# ## The cost rule, by hand
# Per iteration per node, counting floats sent plus received, with P nodes that are both
# workers and server shards:
#
# - parameter server: `PS = 2 M N (P1 + P2 - 2) / P2`, that is `4 M N (P-1) / P`: push the
#   gradient's shards, pull the parameters, and serve the others' pushes and pulls;
# - sufficient factors: `SFB = 2 K (P1 - 1) (M + N)`: send u and v to every peer, receive theirs.
#
# PS stays near `4 M N` whatever P; SFB grows with P. So SFB wins on few nodes and loses on many.
# LeNet's ip1 by hand (M = 500, N = 800, K = 64) on P = 4 nodes:
#
# - PS = 2 · 500 · 800 · (4 + 4 - 2) / 4 = 1,200,000 floats (4.6 MiB),
# - SFB = 2 · 64 · (4 - 1) · (500 + 800) = 499,200 floats (1.9 MiB): SFB moves 2.4x fewer.
#
# SFB <= PS works out to `K P <= 2 M N / (M + N)` (the P - 1 cancels): 615 for ip1, so at K = 64
# SFB wins up to P = 9. The code checks this and the other node counts:

# %%
M, N, K = 500, 800, 64
Ps = [2, 3, 4, 6, 8, 12, 16, 24, 32]
for P in (2, 8, 16):
    ps, sf = cost.ps_floats(M, N, P, P), cost.sfb_floats(K, M, N, P)
    print(f"  P={P:2d}: PS {ps:12,.0f} floats, SFB {sf:12,.0f} floats -> {'SFB' if sf <= ps else 'PS'}")
    assert abs(ps - 4 * M * N * (P - 1) / P) < 1e-6 and sf == 2 * K * (P - 1) * (M + N)
cross = next(P for P in range(2, 100) if cost.sfb_floats(K, M, N, P) > cost.ps_floats(M, N, P, P))
print(f"SFB moves fewer floats up to P = {cross - 1}; from P = {cross} the parameter server wins")
assert cost.ps_floats(M, N, 4, 4) == 1_200_000 and cost.sfb_floats(K, M, N, 4) == 499_200
assert cross - 1 == int(2 * M * N / (M + N) / K) == 9

# %% [markdown]
# AlexNet's fc6 is the layer Poseidon was built for: M = 4096 outputs, N = 9216 inputs, Poseidon's
# batch of K = 256 images per node. By hand, on P = 8 nodes:
#
# - PS = 2 · 4096 · 9216 · (8 + 8 - 2) / 8 = 132,120,576 floats (504 MiB per node per iteration),
# - SFB = 2 · 256 · (8 - 1) · (4096 + 9216) = 47,710,208 floats (182 MiB): 2.8x fewer.
#
# The crossover is `K P <= 2 · 4096 · 9216 / 13312 = 5671`: at K = 256, SFB up to P = 22. A
# layer this wide stays SFB on many more nodes than ip1, because its gradient (M N) grows with the
# product of its sides and its factors (K (M + N)) only with their sum.

# %%
M6, N6, K6 = 4096, 9216, 256
for P in (8, 22, 23, 32):
    ps, sf = cost.ps_floats(M6, N6, P, P), cost.sfb_floats(K6, M6, N6, P)
    print(
        f"  fc6, P={P:2d}: PS {ps * 4 / 2**20:7.0f} MiB, SFB {sf * 4 / 2**20:7.0f} MiB -> {'SFB' if sf <= ps else 'PS'}"
    )
assert cost.ps_floats(M6, N6, 8, 8) == 132_120_576 and cost.sfb_floats(K6, M6, N6, 8) == 47_710_208
assert int(2 * M6 * N6 / (M6 + N6) / K6) == 22
assert cost.sfb_floats(K6, M6, N6, 22) <= cost.ps_floats(M6, N6, 22, 22)
assert cost.sfb_floats(K6, M6, N6, 23) > cost.ps_floats(M6, N6, 23, 23)

fig, ax = plt.subplots(figsize=(7, 3.4))
for (m, n, label), c in zip(((500, 800, "ip1 500x800"), (10, 500, "ip2 10x500")), ("C0", "C1")):
    ax.plot(Ps, [cost.ps_floats(m, n, P, P) * 4 / 2**20 for P in Ps], "-", color=c, label=f"{label}: PS")
    ax.plot(Ps, [cost.sfb_floats(K, m, n, P) * 4 / 2**20 for P in Ps], "--", color=c, label=f"{label}: SFB")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("nodes P")
ax.set_ylabel("MiB per iteration per node")
ax.set_title("Poseidon's cost rule for LeNet's FC layers (batch 64 per node)")
ax.legend(fontsize=7)
show(fig, "11_cost_rule")

# %% [markdown]
# `cost.plan(net, P, host=None)` applies the rule to every layer: convolutions always use the
# server (their gradient is not a sum of outer products of short vectors); each FC layer gets the
# cheaper method. A run pays more than bytes, though: every SFB layer adds frames of its own (and
# cuts the server's gradient bucket where it sits between two server layers), every node
# rebuilds its whole gradient with a GEMM over all nodes' factors, and the thread that serves the
# syncs costs CPU per unit (the SFB layers get a thread of their own). So the runtime's plan (the
# default `host`, this machine's measured costs) keeps an SFB layer only where the whole plan's
# estimated time per iteration says it pays, and prints why; `--comm sfb|ps` still force either.

# %%
for P in (2, 8, 16):
    plan = cost.plan(net, P, host=None)
    print(
        f"P={P:2d}: " + ", ".join(f"{c.name} {c.choice.upper()}" for c in plan),
        f"| {sum(c.bytes for c in plan) / 2**20:.2f} MiB per node per iteration",
    )
for rate in (1e9 / 8, 10e9 / 8):  # the runtime's plan on 4 nodes, on a 1 and a 10 Gbit/s link
    ip1 = {c.name: c for c in cost.plan(net, 4, link_rate=rate)}["ip1"]
    print(f"runtime plan, 4 nodes, {rate * 8 / 1e9:g} Gbit/s: ip1 {ip1.choice.upper()} ({ip1.why})")

# %% [markdown]
# ## Wait-free backprop, in the event model
# Backward runs from the last layer to the first. Without WFBP a node computes the whole
# backward, then synchronizes every layer, then starts the next forward: compute and network
# take turns. With WFBP the sync of layer l starts when layer l's backward ends, while the
# layers below are still computing; the next forward of layer l waits only for layer l. The
# event model in `simulate.py` runs both schedules from per-layer times measured now on this
# machine (`simulate.layers_from_net`) over a stated link (1 Gbit/s, 4 nodes).

# %%
layers = simulate.layers_from_net(net, iterations=3 if QUICK else 10, warmup=1)
link = simulate.Link(simulate.parse_rate("1gbit"), 50e-6)
results = {}
for comm in ("ps", "hybrid"):
    for wfbp in (False, True):
        r = simulate.simulate(layers, 4, link, comm=comm, wfbp=wfbp)
        results[(comm, wfbp)] = r
        print(
            f"  {comm:6s} WFBP {'on ' if wfbp else 'off'}: {r.period * 1e3:7.2f} ms per iteration, {r.bytes / 2**20:.2f} MiB per node, waiting {r.waiting:.0%}"
        )
assert results[("ps", True)].period <= results[("ps", False)].period * 1.0001
assert results[("hybrid", True)].bytes < results[("ps", True)].bytes

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
for ax, wfbp in zip(axes, (False, True)):
    r = results[("hybrid", wfbp)]
    start = min(a for lane, _layer, a, b, it in r.events if it == 3)  # both panels from iteration 3's start
    for lane, _layer, a, b, it in r.events:
        if it in (3, 4):
            y = 0 if lane == "compute" else 1
            ax.barh(
                y,
                (b - a) * 1e3,
                left=(a - start) * 1e3,
                color=("C0" if lane == "compute" else "C3") if it == 3 else ("C9" if lane == "compute" else "C1"),
                edgecolor="w",
                lw=0.3,
            )
    ax.set_yticks([0, 1], ["compute", "network"])
    ax.set_title(
        f"hybrid, WFBP {'on' if wfbp else 'off'}: {r.period * 1e3:.1f} ms per iteration (two iterations shown)",
        fontsize=9,
    )
axes[1].set_xlabel("ms from the start of an iteration (dark: one iteration, light: the next)")
fig.tight_layout()
show(fig, "11_wfbp_timeline")

# %% [markdown]
# With WFBP off, the network lane starts only when the compute lane's backward is done, and the
# next forward waits for all of it. With WFBP on, ip2's and ip1's syncs start during the
# convolutions' backward: the network time that fits under the remaining backward disappears.
# The last sync to start (conv1 and conv2, one gradient bucket) can only start when the whole
# backward is done, WFBP or not, so the runtime synchronizes it exactly as without WFBP: a net
# that is one bucket (CIFAR-10 quick under plain PS) gets nothing from WFBP, and pays nothing.
#
# ## Measured on sockets
# Now the real runtime: 2 nodes in threads of this process, over loopback TCP, each node's
# `Poseidon(node, comm="hybrid", wfbp=True)` joined to lesson 10's parameter server. It must
# train what one process trains, and the bytes each layer moves must follow the rule (plus 48
# bytes per frame).

# %%
from minicaffe.dist.local import SECRET
from minicaffe.dist.poseidon import Poseidon
from minicaffe.dist.ps import Node
from minicaffe.dist.sockets import SocketTransport

iters = 4 if QUICK else 10


def solver():
    param, base, netp = lenet_param()
    param.clear("net")
    param.net_param = netp
    for field in ("test_iter", "test_interval", "snapshot"):
        param.clear(field)
    param.random_seed, param.display, param.max_iter = 7, 0, iters
    param.snapshot_after_train = False
    return caffe.get_solver(param, base_dir=base, log=lambda m: None)


one = solver()
one.step(iters)


def train_on_sockets(wfbp):
    """2 nodes in threads over loopback TCP, hybrid communication -> (solvers, poseidons)."""
    solvers = [solver() for _ in range(2)]
    quiet = lambda m: None
    t0 = SocketTransport(0, 2, "127.0.0.1:0", SECRET, {"net": "lenet"}, 1 << 22, log=quiet)
    ts = [t0, SocketTransport(1, 2, f"127.0.0.1:{t0.address[1]}", SECRET, {"net": "lenet"}, 1 << 22, log=quiet)]
    forming = [threading.Thread(target=t.form) for t in ts]
    for th in forming:
        th.start()
    for th in forming:
        th.join(60)
    nodes = [Node(s, t, gradient_slots=2) for s, t in zip(solvers, ts)]
    pos = [Poseidon(n, "hybrid", wfbp, log=quiet) for n in nodes]
    errors = {}

    def go(r):
        s, node = solvers[r], nodes[r]
        try:
            node.attach_solver()
            node.start()
            s.step(iters)
            node.reports = node.finish()
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            errors[r] = exc
            node.abort()
        finally:
            pos[r].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    if errors:
        raise errors[min(errors)]
    return solvers, pos


solvers, pos = train_on_sockets(wfbp=True)
for s in solvers:
    err = max(float(np.abs(a.data - b.data).max()) for a, b in zip(s.net.learnable_params, one.net.learnable_params))
    print(f"largest parameter difference from one process after {iters} iterations: {err:.1e}")
    assert err < 1e-4
print("SFB layers:", sorted(layer.name for layer in pos[0].sfb.values()))

# %%
measured = pos[0].measured_bytes(iters)
predicted = pos[0].predicted_bytes()
names = list(predicted)
for name in names:
    rule, headers = predicted[name]
    print(
        f"  {name:6s} measured {measured[name] / 2**10:9.1f} KiB/iter, rule {rule / 2**10:9.1f} + headers {headers / 2**10:.1f}"
    )
    assert abs(measured[name] - (rule + headers)) <= 0.05 * (rule + headers)
fig, ax = plt.subplots(figsize=(7, 3))
x = np.arange(len(names))
ax.bar(x - 0.2, [measured[n] / 2**10 for n in names], 0.4, label="measured")
ax.bar(x + 0.2, [sum(predicted[n]) / 2**10 for n in names], 0.4, label="rule + headers")
ax.set_xticks(x, [f"{n}\n({'SFB' if n in {l.name for l in pos[0].sfb.values()} else 'PS'})" for n in names])
ax.set_yscale("log")
ax.set_ylabel("KiB per iteration, node 0")
ax.legend(fontsize=8)
ax.set_title("hybrid communication on 2 nodes: bytes per layer")
show(fig, "11_bytes_measured")

# %% [markdown]
# ## The timeline, measured
# Each node records what it did in a few iterations (`Poseidon.timeline`, from its 3rd on: each
# layer's forward and backward, each sync from its start until its fresh parameters are in, and
# how long the next forward waited for them). Train the same 2 nodes once more with WFBP off and
# draw one iteration of node 0 from both runs, as the event model drew them above:

# %%
_, pos_off = train_on_sockets(wfbp=False)
fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), sharex=True)
rows = {"forward": 2, "backward": 2, "wait": 1, "sync": 0}
colors = {"conv1": "C0", "conv2": "C2", "ip1": "C3", "ip2": "C4"}
for ax, (wfbp, p) in zip(axes, ((False, pos_off[0]), (True, pos[0]))):
    ev = [e for e in p.timeline if e[0] in rows and e[4] == 2]  # iteration 2 (the 3rd)
    t0 = min(a for _lane, _name, a, _b, _c in ev)
    for lane, name, a, b, _c in ev:
        color = "0.8" if lane == "wait" else colors.get(name, "0.6")
        y, h = rows[lane], 0.8
        if lane == "sync":  # syncs run at once: a thin row each (conv1+conv2's bucket ends in conv1)
            y, h = -0.3 + 0.2 * list(colors).index(name) if name in colors else 0, 0.2
        ax.barh(y, (b - a) * 1e3, left=(a - t0) * 1e3, height=h, color=color, edgecolor="k", lw=0.2)
    ax.set_yticks([0, 1, 2], ["sync", "waiting", "compute"])
    ax.set_title(f"measured: hybrid, 2 nodes on loopback, WFBP {'on' if wfbp else 'off'}: node 0", fontsize=9)
    backward = {name: (a, b) for lane, name, a, b, _c in ev if lane == "backward"}
    syncs = {name: (a, b) for lane, name, a, b, _c in ev if lane == "sync"}
    end = max(b for _a, b in backward.values())
    inside = sorted(name for name, (a, _b) in syncs.items() if a < end)
    print(f"WFBP {'on ' if wfbp else 'off'}: syncs that start inside the backward: {inside or 'none'}")
    if wfbp:  # ip1's factors leave while conv2's and conv1's backward still run
        assert syncs["ip1"][0] < backward["conv1"][1]
    else:
        assert not inside
axes[1].set_xlabel("ms from the iteration's first event (colours: conv1, conv2, ip1, ip2; grey: waiting)")
fig.tight_layout()
show(fig, "11_wfbp_measured")

# %% [markdown]
# With WFBP the syncs of ip2 and ip1 start inside the backward, and without it every sync
# starts after it: that much the picture shows on any machine. Whether the iteration gets
# shorter is another matter. Both nodes here are threads of one process on this machine's two
# cores, over loopback: the syncs' work (framing, sending, ip1's rebuild and update) competes
# with the backward it overlaps for the same cores, and there is little wire time to hide.
# Overlap pays where the network, not the CPU, is the bottleneck: `benchmarks/poseidon.py`
# draws the same picture from an emulated cluster with shaped links, and docs/POSEIDON.md says
# where WFBP paid there and where it could not.

# %% [markdown]
# ## Exercises
# 1. Write `choose(m, n, k, P)`: "sfb" or "ps" by Poseidon's rule for an m x n FC layer with k
#    rows per node on P nodes (P workers, P server shards). Check: `python -m tutorials.check 11.1`
# 2. Write `sfb_gradient(us, vs)`: given every node's factors (lists of K_p x M and K_p x N
#    arrays), the summed weight gradient (M x N) with one matrix product. Check:
#    `python -m tutorials.check 11.2`
# 3. (thought) WFBP overlaps a layer's sync with the backward of the layers *below* it. Why does
#    that help a net like AlexNet or VGG, whose big FC layers sit at the top, much more than a
#    net whose biggest layer is the first?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 11 done")
