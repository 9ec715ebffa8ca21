# %% [markdown]
# # Lesson 10: across machines, with sockets
#
# **You will learn** how tensors travel between machines as frames (a fixed header, then the
# raw bytes), why a receiver checks a header before it reads a byte of payload, how two nodes
# prove they share a secret without sending it, how a sharded parameter server over TCP
# reproduces one machine's training exactly, and what a slower network does to a step.
# **You need** lesson 9 (a parameter server and workers in one process).
#
# Lesson 9's server and workers shared memory. Across machines nothing is shared: every byte of
# gradient and parameter crosses a network. minicaffe's distributed runtime (`minicaffe/dist/`)
# speaks its own small protocol over TCP sockets (or over MPI); this lesson takes it apart on
# this machine's loopback interface, where the whole protocol runs exactly as across machines.

# %%
import socket
import threading

import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, ROOT, cleanup, show

import minicaffe as caffe
from minicaffe.dist import frames as F
from minicaffe.dist import transport
from minicaffe.dist.local import run_nodes
from minicaffe.dist.sockets import Connection

print("quick mode" if QUICK else "full mode")

# %% [markdown]
# ## A frame, byte by byte
# Every message is one 48-byte header followed by the tensor's bytes, in C order. The header
# says what the tensor is (kind, which blob, which clock), its dtype and shape, and its length,
# which must agree with the shape. Here is the header of a 2x3 float32 gradient of blob 4 at
# clock 7, from node 1:

# %%
g = np.arange(6, dtype=np.float32).reshape(2, 3)
header = F.pack_header(F.GRAD, key=4, sender=1, dtype=g.dtype, shape=g.shape, clock=7)
print(f"{len(header)} bytes:")
fields = [
    ("magic", 0, 4),
    ("version", 4, 6),
    ("kind", 6, 8),
    ("key", 8, 12),
    ("sender", 12, 14),
    ("dtype", 14, 15),
    ("ndim", 15, 16),
    ("clock", 16, 24),
    ("shape", 24, 40),
    ("nbytes", 40, 48),
]
for name, a, b in fields:
    print(f"  {a:2d}..{b - 1:2d} {name:8s} {header[a:b].hex(' ')}")
h = F.parse_header(header, limit=1 << 20)
print("parsed back:", h)
assert h.nbytes == g.nbytes and tuple(h.shape) == g.shape

# %% [markdown]
# A receiver trusts nothing. A header whose length disagrees with its shape, or exceeds the
# largest tensor this node would ever accept, is refused from the 48 bytes alone, before
# anything is allocated or read: a stranger claiming a 2^62-byte payload costs nothing.

# %%
lying = bytearray(header)
lying[40:48] = (2**62).to_bytes(8, "little")
for label, buf in (("length 2^62", bytes(lying)), ("not a minicaffe peer", b"GET / HTTP/1.1\r\n" + bytes(32))):
    try:
        F.parse_header(buf, limit=1 << 20)
    except F.FrameError as e:
        print(f"refused ({label}): {e}")

# %% [markdown]
# ## Over a socket
# A connected pair of sockets stands for two machines. The sender hands the kernel the header and
# a view of the array's own memory in one gather write (`sendmsg`, no copy of the tensor); the
# receiver reads the header, checks it against what it expects (this blob has this shape), and
# reads the payload straight into the preallocated destination (`recv_into`). TCP may deliver
# any number of bytes per read, so both sides loop until a frame is complete.

# %%
a_sock, b_sock = socket.socketpair()
sender = Connection(a_sock, "node B", limit=1 << 22, rank=1)
receiver = Connection(b_sock, "node A", limit=1 << 22, rank=0)  # 4 MiB: its largest tensor
big = np.random.default_rng(0).standard_normal((500, 800)).astype(np.float32)  # LeNet's ip1 weights
dest = np.empty_like(big)
th = threading.Thread(target=sender.send, args=(F.GRAD, 2, 7, big), daemon=True)
th.start()
h = receiver.read_header()
F.check_expected(h, F.GRAD, dest.dtype, dest.shape, "node B")
receiver.read_into(h, dest)
th.join()
print(f"received {h!r}: {h.nbytes} bytes + {F.HEADER_SIZE} of header, equal: {np.array_equal(dest, big)}")
assert np.array_equal(dest, big)

# %% [markdown]
# ## The handshake: a shared secret that never travels
# Any program can connect to a listening port, so a node must know its peer is one of its own.
# Nodes share a secret; each connection starts with a challenge: the server sends a random nonce,
# the client answers with its own nonce and an HMAC of both under the secret, the server answers
# with an HMAC proving it knows the secret too. The secret never crosses the wire, and a recorded
# exchange is useless later (fresh nonces).


# %%
def handshake(server_secret, client_secret):
    s1, s2 = socket.socketpair()
    srv, cli = Connection(s1, "client", 1 << 16), Connection(s2, "server", 1 << 16)
    out = {}

    def server():
        try:
            transport.server_auth(srv, server_secret, "client")
            out["server"] = "accepted"
        except Exception as e:  # noqa: BLE001  (shown)
            out["server"] = f"refused: {e}"

    t = threading.Thread(target=server, daemon=True)
    t.start()
    try:
        transport.client_auth(cli, client_secret, "server")
        out["client"] = "in"
    except Exception as e:  # noqa: BLE001  (shown)
        out["client"] = f"refused: {e}"
    t.join()
    s1.close()
    s2.close()
    return out


good = handshake(b"our secret", b"our secret")
bad = handshake(b"our secret", b"a guess")
print("same secret :", good)
print("wrong secret:", bad)
assert good == {"server": "accepted", "client": "in"} and "refused" in bad["server"]

# %% [markdown]
# ## A sharded parameter server over TCP
# Each node owns 1/P of every blob's parameters (its *shard*) and runs the solver's update on it.
# Every clock, a node computes the gradient of its share of the batch, sends each slice to the
# node that owns it, the owners sum and update, and send the fresh slices back. With P nodes,
# a node sends `(P-1)/P` of every gradient and `P-1` copies of its shard: about
# `2 (P-1)/P x (parameter bytes)` each way per clock.
#
# `minicaffe.dist.local.run_nodes` runs P nodes as threads of this process, each with its own
# solver and its own socket transport on 127.0.0.1: the real protocol, only the processes are
# missing. The claim to check: **BSP over 2 nodes trains exactly what one process trains**.

# %%
import os

from minicaffe import proto
from minicaffe.parallel import with_synthetic_data
from minicaffe.solvers import load_solver_param

K = 3 if QUICK else 10


def lenet_solver(batch=32):
    param, base = load_solver_param(os.path.join(ROOT, "nets", "lenet_solver.prototxt"))
    net = with_synthetic_data(proto.parse_file(os.path.join(base, param.net), "NetParameter"), count=256)
    for lp in net.layer:
        if lp.type == "Data":
            lp.data_param.batch_size = batch
    param.clear("net")
    param.net_param = net
    for field in ("test_iter", "test_interval", "snapshot"):
        param.clear(field)
    param.random_seed, param.display, param.max_iter = 7, 0, K
    param.snapshot_after_train = False
    return caffe.get_solver(param, base_dir=base, log=lambda m: None)


one = lenet_solver()
one.step(K)
solvers = [lenet_solver() for _ in range(2)]
# (bucket_bytes=0: every blob travels in frames of its own, so the traffic of each can be read
# below; training runs group consecutive layers into 1 MiB buckets, a few frames per clock
# instead of a frame per blob and peer: docs/DISTRIBUTED.md)
nodes = run_nodes(solvers, iters=K, bucket_bytes=0)
for s in solvers:
    err = max(float(np.abs(a.data - b.data).max()) for a, b in zip(s.net.learnable_params, one.net.learnable_params))
    print(f"largest parameter difference from one process after {K} clocks: {err:.2e}")
    assert err < 1e-4

# %%
rep = nodes[0].reports[1]
param_bytes = sum(p.count for p in solvers[0].net.learnable_params) * 4
sent = sum(v["sent"] for v in rep["layers"].values())
expected = K * 2 * param_bytes * (2 - 1) / 2
print(
    f"node 1 sent {sent / 2**20:.2f} MiB in {K} clocks; the rule 2 (P-1)/P x params x clocks gives {expected / 2**20:.2f} MiB"
)
assert abs(sent - expected) / expected < 0.05
names = list(rep["layers"])
fig, ax = plt.subplots(figsize=(7, 3))
ax.bar(names, [rep["layers"][n]["sent"] / K / 2**10 for n in names], color="C0", label="sent per clock (measured)")
counts = [p.count for p in solvers[0].net.learnable_params]
ax.plot(names, [2 * c * 4 * 0.5 / 2**10 for c in counts], "k_", ms=30, mew=2, label="2 (P-1)/P x blob bytes")
ax.set_yscale("log")
ax.set_ylabel("KiB per clock")
ax.set_title("node 1's traffic per blob, 2 nodes over loopback TCP")
ax.legend(fontsize=8)
ax.tick_params(axis="x", rotation=45)
show(fig, "10_bytes_per_blob")

# %% [markdown]
# ## An emulated link
# Loopback moves gigabytes per second; a cluster on commodity Ethernet moves 1 Gbit/s (125 MB/s)
# or less. The transport can shape its sending side like such a link (a token bucket per peer:
# bytes leave at the link's rate, plus a latency per frame), so a slow network can be felt on one
# machine. (With root, `python -m minicaffe.dist.emulate` builds a real emulated cluster with
# network namespaces and `tc` instead.) We train the same 2 nodes (batch 8, so the arithmetic is
# small) over links of falling rate, and read from node 0's report how much of each clock went to
# computing and how much to synchronizing (sending, and waiting for the fresh parameters).

# %%
rates = {"loopback": None, "1 Gbit/s": "1gbit", "100 Mbit/s": "100mbit"}
if not QUICK:
    rates["20 Mbit/s"] = "20mbit"
clocks = 4 if QUICK else 20
timing = {}
for label, rate in rates.items():
    link = None if rate is None else (transport.parse_rate(rate), transport.parse_delay("0.1ms"))
    nodes = run_nodes([lenet_solver(batch=8) for _ in range(2)], iters=clocks, link=link)
    r = nodes[0].reports[0]
    timing[label] = (r["compute_s"] / r["iterations"], r["sync_s"] / r["iterations"])
    wire = param_bytes / transport.parse_rate(rate) if rate else 0.0
    print(
        f"  {label:10s} compute {timing[label][0] * 1e3:6.1f} ms, sync {timing[label][1] * 1e3:6.1f} ms per clock (the link alone: {wire * 1e3:.1f} ms)"
    )
# Whatever else the machine is doing, the slowest link shows: a node's gradients must reach the
# other node before that node can send back the fresh parameters, and the second half of that
# chain (the pull, half the wire time) is always inside the node's sync.
slowest = list(rates)[-1]
assert timing[slowest][1] > 0.5 * param_bytes / transport.parse_rate(rates[slowest])

fig, ax = plt.subplots(figsize=(7, 2.8))
labels = list(timing)
ax.barh(labels, [c * 1e3 for c, _ in timing.values()], color="C0", label="compute")
ax.barh(
    labels,
    [w * 1e3 for _, w in timing.values()],
    left=[c * 1e3 for c, _ in timing.values()],
    color="C3",
    label="sync (network)",
)
ax.invert_yaxis()
ax.set_xlabel("ms per clock, node 0 (measured)")
ax.legend(fontsize=8)
ax.set_title("LeNet over 2 nodes: the network sets the pace")
show(fig, "10_link_rates")

# %% [markdown]
# With 2 nodes each node sends about one copy of the parameters' bytes per clock (half the
# gradients out, its half of the parameters back to the other node), so a slow link adds about
# `parameter bytes / rate` to every clock:

# %%
print(
    f"LeNet: {sum(counts):,} parameters = {param_bytes / 1e6:.2f} MB; at 100 Mbit/s that is {param_bytes / transport.parse_rate('100mbit') * 1e3:.0f} ms per clock on the wire, against {timing['loopback'][0] * 1e3:.0f} ms of compute here"
)

# %% [markdown]
# On a slow link the network, not the arithmetic, sets the pace. Poseidon's two answers (lesson
# 11) are to overlap that traffic with the backward pass
# (wait-free backpropagation) and to send a fully connected layer's gradient as its two small
# factors instead of the matrix (sufficient-factor broadcasting).
#
# ## Exercises
# 1. Write `recv_exactly(sock, n)`: return exactly n bytes from a socket whose reads may return
#    fewer, raising `ConnectionError` if the peer closes early. Check: `python -m tutorials.check 10.1`
# 2. Write `ps_bytes_per_clock(counts, P)`: the bytes one node sends per clock with P nodes for
#    blobs of `counts` float32 numbers (payload only, shards of 1/P). Check:
#    `python -m tutorials.check 10.2`
# 3. (thought) Why does the receiver check the header against what it expects *before* reading the
#    payload, and why read the payload straight into the destination array?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 10 done")
