"""Predict distributed training time from per-layer compute times and the network: an event model.

    python -m minicaffe.dist.simulate --plan                     # AlexNet and VGG-16 on a named GPU
    python -m minicaffe.dist.simulate lenet --measure --nodes 2 4 --bandwidth 1gbit
    python -m minicaffe.dist.simulate --times times.json --nodes 8 16 32 --bandwidth 10gbit 40gbit

One node, one iteration after another, two resources (every node does the same, so one node's
timeline is everyone's under BSP):

- **compute** runs layer 0..L-1 forward, then L-1..0 backward, one layer at a time;
- **the communication thread** synchronizes one layer at a time, first come first served. A
  layer's sync takes latency x round trips + (bytes / 2) / bandwidth (the cost rule counts
  sent + received; a full-duplex link moves both halves at once) + the CPU work the method needs:
  PS applies the update to this node's 1/P shard; SFB rebuilds the gradient from all P nodes'
  factors (P times the layer's own weight-gradient GEMM) and applies the whole update.

The schedule is the only difference between the modes:

- **without WFBP** every sync is queued when the whole backward has finished, and the next
  forward waits for all of them (compute, then communicate, then compute);
- **with WFBP** layer l's sync is queued the moment layer l's backward ends, so it overlaps the
  backward of the layers below, and the next forward of layer l waits only for layer l's sync.

Nodes that share one machine's cores (the emulated cluster: ``Host``) run the same two lanes
as CPU work under processor sharing (``shared_schedule``): a node owns cores / P of the machine,
the lanes busy at once split it, and a lane that only waits leaves its share idle.

Time per iteration is the steady-state period of this schedule; the speedup on P nodes is
P x (one node's time per iteration, compute + update) / (P nodes' time per iteration), with a
fixed batch per node (weak scaling, as Poseidon reports it).

Per-layer forward/backward times come from ``python -m minicaffe.time`` (``--measure``), from
a JSON file (``--times``: ``[{"name", "forward", "backward"}]`` in milliseconds, with ``m, n,
k, count`` for layers with parameters), or, for ``--plan``, from a stated GPU model: each
layer's FLOPs (counted from the prototxt's shapes) over a named GPU's sustained FLOP/s.
"""

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field

from ..errors import MinicaffeError
from . import cost
from .cost import COMM_MODES, ps_floats, sfb_floats

# -- inputs -------------------------------------------------------------------------------------


@dataclass
class Layer:
    """One layer as the simulator sees it: seconds of compute and the parameters it synchronizes.

    ``count``: floats of learnable parameters (0: nothing to sync); ``m, n, k``: the FC geometry
    (M x N weight, K rows per node) when SFB may serve it; ``update``: seconds to apply the
    solver to all ``count`` parameters; ``wgrad``: seconds of the layer's weight-gradient GEMM
    on its own K rows (default: half its backward: dW and dx are GEMMs of the same size).
    """

    name: str
    forward: float
    backward: float
    count: int = 0
    m: int = None
    n: int = None
    k: int = None
    update: float = 0.0
    wgrad: float = None
    itemsize: int = 4
    sync_cpu: dict = None  # measured CPU seconds of this node's part of a sync: {"ps": s, "sfb": s}
    blobs: int = 2  # learnable blobs (weight, bias): PS sends a frame per blob per peer each way
    # seconds to zero the layer's gradient before the backward adds into it, where it is synced
    # by PS (an SFB layer's gradient is rebuilt from the factors: nothing to zero)
    zero: float = 0.0

    @property
    def weight_gradient(self):
        return self.backward / 2 if self.wgrad is None else self.wgrad

    @property
    def fc(self):
        return self.m is not None


@dataclass
class Link:
    """A node's full-duplex link: ``bandwidth`` in bytes/s each way, one-way ``latency`` in s."""

    bandwidth: float
    latency: float = 0.0
    topology: str = "star"  # star: one link per node to a switch; mesh: one link per pair of nodes
    burst: float = 0.0  # bytes a shaper lets through at once after an idle spell (tc tbf's bucket)

    def __str__(self):
        return f"{format_rate(self.bandwidth)}, {self.latency * 1e3:g} ms" + (
            ", a link per pair" if self.topology == "mesh" else ""
        )

    def rate(self, nodes):
        """Bytes/s one node can send (and receive) at once: a star shares one link among its
        peers; a mesh (the transport's token bucket per connection) has one per peer."""
        return self.bandwidth * (max(nodes - 1, 1) if self.topology == "mesh" else 1)


@dataclass
class Host:
    """The machine the nodes share, when they share one (the emulated cluster): ``cores``, and
    ``tcp_cpu``, the CPU seconds one byte moved from a node to another costs both ends together
    (framing, the copies into and out of the kernel, TCP, veth; measured in a training run by
    ``benchmarks/poseidon.py --calibrate-bytes``, or ``python -m minicaffe.dist.linkcheck``'s
    single stream). None (the default) for nodes with machines of their own. The costs from
    training runs below: ``benchmarks/poseidon.py --calibrate-runs``."""

    cores: int
    tcp_cpu: float = 0.0
    frame_cpu: float = 0.0  # CPU seconds a frame costs both ends beyond its bytes
    # CPU seconds each sync started inside the backward (WFBP) costs the node beyond its frames:
    # the switches between the compute thread, the senders, the receivers and the shard's or the
    # SFB thread that the interleaving brings, on cores every node process already keeps busy
    wfbp_sync_cpu: float = 0.0
    # CPU seconds a node's kernels cost per second of the same kernels measured alone: a number
    # (where the node processes outnumber the cores), or {nodes: factor} measured at some node
    # counts (the nearest one applies; other processes and the node's own helper threads share
    # the cores and their caches even where each process has a core): from training runs, not
    # from the layers' own timing. It applies to the compute and to the sync's kernels (the
    # update, SFB's rebuild) alike: which thread of the node runs a kernel does not change
    # what the other processes take from the cores and caches it runs on
    contention: object = 1.0
    # CPU seconds per frame sent that a transport's own rate limiter costs (minicaffe's --link:
    # a lock, a sleep and its wake-up per frame and per piece); 0 for links shaped outside it
    limiter_frame_cpu: float = 0.0
    # CPU seconds each sync unit costs the thread that serves it beyond its kernels (waking the
    # shard's server thread or the SFB thread, the frame handler, the locks)
    unit_cpu: float = 0.0
    # CPU seconds per iteration each thread that serves syncs (the shard's server thread, the SFB
    # thread) costs beyond its units, where it serves any
    thread_cpu: float = 0.0
    # CPU seconds per iteration of the rest of a node process beyond its frames and bytes (the
    # main thread's loop, log and waits; the transport threads' wake-ups), on the compute lane
    iteration_cpu: float = 0.0
    # seconds per iteration the nodes spend out of step at BSP's barrier, the cores idle: the
    # processes on shared cores do not reach it together (the scheduler runs them in turns), and
    # the first to arrive waits for the last. A number, or {nodes: seconds} as ``contention``.
    # Measured where nothing else waits (training runs with no link limit): the period minus the
    # nodes' CPU over the cores
    drift: object = 0.0
    # ``contention`` for the SFB thread (the tiled rebuild + update: memory-bound, and every node
    # runs it at the same moment), where measured apart in training runs: its CPU there per second
    # of what the model charges it alone (its kernels, ``unit_cpu`` per layer, ``thread_cpu``),
    # applied to all of that; None: its kernels slow as ``contention`` says
    sfb_contention: object = None
    # CPU seconds per byte a node moves (sent + received) spent on the machine's cores outside
    # every node process's clocks: the kernel's network work done in softirq context (veth,
    # bridge, tc) rather than charged to a node's threads. Measured, where its time shows, in
    # training runs that move hundreds of megabytes per iteration: the cores x the period less
    # the nodes' own CPU, per byte (/proc/stat: nearly all of it busy, not idle)
    outside_cpu_per_byte: float = 0.0

    @staticmethod
    def _at(value, nodes, default):
        if not isinstance(value, dict):
            return value
        if not value:
            return default
        return value[min(value, key=lambda p: (abs(p - nodes), -p))]  # the nearest node count

    def inflation(self, nodes):
        """Compute CPU seconds per second measured alone, for ``nodes`` node processes."""
        if nodes <= 1:
            return 1.0
        if isinstance(self.contention, dict):
            return self._at(self.contention, nodes, 1.0)
        return self.contention if nodes > self.cores else 1.0

    def sfb_inflation(self, nodes):
        """The SFB thread's CPU seconds per second of what it costs alone, for ``nodes`` nodes."""
        if self.sfb_contention is None or nodes <= 1:
            return self.inflation(nodes)
        return self._at(self.sfb_contention, nodes, self.inflation(nodes))

    def drift_at(self, nodes):
        """Seconds per iteration at BSP's barrier with the cores idle, for ``nodes`` nodes."""
        return 0.0 if nodes <= 1 else self._at(self.drift, nodes, 0.0)

    def transport_cpu(self, nbytes, frames):
        """CPU seconds one node spends moving ``nbytes`` (sent + received) in ``frames`` frames
        (sent + received): half of each byte's and frame's cost is the sender's, half the receiver's;
        a limiter's, per frame sent, is the sender's alone; the kernel's work outside the node
        processes, per byte (``outside_cpu_per_byte``), is charged to the node that moves it."""
        per_byte = self.tcp_cpu / 2 + self.outside_cpu_per_byte
        return nbytes * per_byte + frames / 2 * (self.frame_cpu + self.limiter_frame_cpu)


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text):
    """'1gbit', '10Gbit', '100mbit', '40gbps' -> bytes per second; 'inf' -> infinity."""
    t = str(text).strip().lower()
    if t in ("inf", "infinite"):
        return math.inf
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps|b/s|bit/s)?", t)
    if not m:
        raise MinicaffeError(f"bandwidth '{text}' not understood; write e.g. 1gbit, 10gbit, 100mbit")
    return float(m.group(1)) * _UNITS[m.group(2)] / 8.0


def parse_seconds(text):
    """'0.1ms', '50us', '1s', '0' -> seconds."""
    t = str(text).strip().lower()
    m = re.fullmatch(r"([0-9.]+)\s*(s|ms|us|ns)?", t)
    if not m:
        raise MinicaffeError(f"latency '{text}' not understood; write e.g. 0.1ms, 50us")
    return float(m.group(1)) * {"s": 1, None: 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]


def format_rate(bytes_per_s):
    if math.isinf(bytes_per_s):
        return "inf"
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits / 1e3:g} kbit/s"


# -- the cost of one layer's sync ---------------------------------------------------------------


def method_of(layer, nodes, comm):
    """'ps', 'sfb' or None (nothing to sync) for one layer by Poseidon's byte rule alone."""
    if layer.count == 0:
        return None
    if comm == "ps" or not layer.fc:
        return "ps"
    if comm == "sfb":
        return "sfb"
    return "sfb" if sfb_floats(layer.k, layer.m, layer.n, nodes) <= ps_floats(layer.m, layer.n, nodes, nodes) else "ps"


def choose_methods(layers, nodes, comm="hybrid", bucket_bytes=0, link_rate=None, rule_host=None):
    """Every layer's 'ps', 'sfb' or None, chosen as the runtime chooses (``cost.choose``).

    ``rule_host`` None: Poseidon's byte rule per layer. A ``cost.HostCosts`` (the runtime's
    ``cost.DEFAULT_HOST``): the rule's SFB layers stay SFB only where the whole plan's estimated
    time per iteration says SFB pays (frames, the buckets an SFB layer cuts, the rebuild), with
    ``link_rate`` bytes/s each way (None: the 10 Gbit/s the runtime assumes)."""
    costs = [
        cost.layer_cost(i, l.name, l.count, l.m, l.n, l.k, l.blobs, l.itemsize) for i, l in enumerate(layers) if l.count
    ]
    cost.choose(costs, nodes, comm=comm, bucket_bytes=bucket_bytes, link_rate=link_rate, host=rule_host)
    chosen = {c.index: c.choice for c in costs}
    return [chosen.get(i) for i in range(len(layers))]


def sync_cost(layer, method, nodes, link):
    """(network seconds, CPU seconds, bytes sent + received) of one layer's sync.

    The CPU part runs on the communication thread too (it is what slows when nodes share cores):
    ``layer.sync_cpu[method]`` where measured, else PS: this node's 1/P of the update; SFB: the
    rebuild (P x the layer's own weight-gradient GEMM) and the whole update.
    """
    if method is None:
        return 0.0, 0.0, 0.0
    if nodes == 1:
        return 0.0, layer.update, 0.0  # nothing moves; the node applies the update itself
    measured = (layer.sync_cpu or {}).get(method)
    if method == "ps":
        nbytes = ps_floats(layer.count, 1, nodes, nodes) * layer.itemsize
        rounds, cpu = 2, layer.update / nodes  # push, then pull; this node's shard of the update
    else:
        nbytes = sfb_floats(layer.k, layer.m, layer.n, nodes) * layer.itemsize
        rounds, cpu = 1, nodes * layer.weight_gradient + layer.update  # rebuild from P nodes' rows; update
    cpu = cpu if measured is None else measured
    return rounds * link.latency + nbytes / 2 / link.rate(nodes), cpu, nbytes


# -- the event model -----------------------------------------------------------------------------


@dataclass
class Result:
    """A simulated run: seconds per iteration, bytes per node per iteration, and its timeline."""

    nodes: int
    comm: str
    wfbp: bool
    period: float
    compute: float
    bytes: float
    methods: dict
    events: list = field(default_factory=list)  # (lane, layer name, start, end, iteration)
    cpu: dict = field(default_factory=dict)  # one node's CPU seconds per iteration by kind

    @property
    def waiting(self):
        """Share of the iteration compute spends waiting for the network."""
        return max(self.period - self.compute, 0.0) / self.period if self.period > 0 else 0.0


def sync_units(layers, methods, bucket_bytes=0):
    """What synchronizes as one: lists of layer indices, each ready when its lowest layer's
    backward ends, in the order the backward makes them ready. An SFB layer is a unit of its
    own; PS layers form the runtime's gradient buckets (``cost.plan_buckets``): from the last
    layer back, consecutive PS layers (layers without parameters between them do not count)
    until a bucket holds ``bucket_bytes`` or more; an SFB layer ends a bucket. ``bucket_bytes``
    0: every PS layer on its own (and each blob in its own frames)."""
    counts, layer_of, ps_blobs = [], [], []
    for i, (l, m) in enumerate(zip(layers, methods)):
        if m is None:
            continue
        per = [l.count // l.blobs] * l.blobs if l.blobs > 1 else [l.count]
        per[-1] += l.count - sum(per)
        for c in per:
            if m == "ps":
                ps_blobs.append(len(counts))
            counts.append(c)
            layer_of.append(i)
    itemsize = next((l.itemsize for l in layers if l.count), 4)
    units = [[i] for i, m in enumerate(methods) if m == "sfb"]
    for bucket in cost.plan_buckets(counts, ps_blobs, layer_of, itemsize, bucket_bytes):
        unit = sorted({layer_of[b] for b in bucket})
        if unit not in units:  # (bucket_bytes 0: a bucket per blob, one unit per layer)
            units.append(unit)
    return sorted(units, key=lambda u: -max(u))


def simulate(
    layers,
    nodes,
    link,
    comm="hybrid",
    wfbp=True,
    iterations=8,
    compute_scale=1.0,
    cpu_overlap=True,
    host=None,
    bucket_bytes=0,
    rule_host=None,
    sfb=None,
):
    """Run the schedule for ``iterations`` iterations; the period is measured over the last ones.

    Each layer's method is the runtime's choice (``choose_methods``: Poseidon's byte rule, or
    with ``rule_host`` a ``cost.HostCosts`` the runtime's cost-aware rule over this link), or
    ``sfb``, the names of the layers a run synchronized by SFB (every other one by PS).

    ``compute_scale`` multiplies every compute time and CPU part of a sync (e.g. a slower
    machine). ``cpu_overlap=False``: the cores are all busy computing, so every CPU second a
    sync needs (update, rebuild) is taken from the compute (added to each iteration's compute)
    instead of overlapping it (nodes with machines of their own only).

    ``host`` (a Host): the P nodes share ``host.cores`` cores (``shared_schedule``). Then the
    node's two lanes, compute and communication, are CPU work sharing the cores with everyone's:
    while a sync waits only for the wire, or the compute only for a sync, that lane needs no
    core. The CPU work of a node per iteration: its compute (x ``host.inflation(P)``), the rest
    of its process (``host.iteration_cpu``), and per sync unit the transport's CPU for its bytes
    and frames (``host.tcp_cpu``, ``host.frame_cpu``, both ends), the serving thread's
    (``host.unit_cpu``, and ``host.thread_cpu`` once an iteration per serving thread), the update
    or rebuild (kernels like the compute's: x ``host.inflation(P)`` too; where the SFB thread's
    factor is measured, all its CPU x ``host.sfb_inflation(P)``), and with WFBP ``host.wfbp_sync_cpu`` (thread switches on shared
    cores). An SFB layer's own weight gradient is not computed on the nodes (the rebuilt one
    replaces it), with or without a host.

    ``bucket_bytes``: the PS layers sync in gradient buckets (``sync_units``): a bucket's
    layers travel together (4 (P - 1) frames per bucket instead of per blob), ready when its
    lowest layer's backward ends.
    """
    if comm not in COMM_MODES:
        raise MinicaffeError(f"comm must be one of {', '.join(COMM_MODES)}, got '{comm}'")
    if nodes < 1 or iterations < 3:
        raise MinicaffeError("simulate needs nodes >= 1 and iterations >= 3")
    wfbp = wfbp and nodes > 1  # one node has nothing to overlap: it updates after backward, as Caffe
    n = len(layers)
    inflate = host.inflation(nodes) if host is not None else 1.0  # compute CPU s per s measured alone
    sfb_inflate = host.sfb_inflation(nodes) if host is not None else 1.0  # the SFB thread's kernels'
    if sfb is not None:
        methods = [None if not l.count else "sfb" if l.name in sfb else "ps" for l in layers]
    else:
        methods = choose_methods(layers, nodes, comm, bucket_bytes, link.bandwidth, rule_host)
    own = [
        inflate * (l.backward - (l.weight_gradient if m == "sfb" and nodes > 1 else 0.0))
        for l, m in zip(layers, methods)
    ]
    fwd = [inflate * l.forward * compute_scale for l in layers]
    if n and nodes > 1:  # the node zeroes its PS layers' gradients first
        fwd[0] += inflate * compute_scale * sum(l.zero for l, m in zip(layers, methods) if m == "ps")
    bwd = [b * compute_scale for b in own]
    cpu_kinds = {"compute": sum(fwd) + sum(bwd), "sync": 0.0, "transport": 0.0, "wfbp": 0.0}
    each = [sync_cost(l, m, nodes, link) for l, m in zip(layers, methods)]  # (net s, CPU s, bytes)
    units = sync_units(layers, methods, bucket_bytes)
    served = set()  # the methods whose serving thread has a unit already
    nbytes = 0.0
    parts = []  # per unit: (bytes each way, latency part, transport CPU, sync CPU)
    # WFBP starts a unit's sync inside the backward unless it holds the lowest layer that syncs:
    # that one can only start once the backward is done, and the runtime syncs it as without WFBP
    early = cost.starts_in_backward(units) if wfbp else [False] * len(units)
    for u, unit in enumerate(units):
        m = methods[unit[0]]
        b = sum(each[i][2] for i in unit)
        cpu_s = sum(each[i][1] for i in unit) * compute_scale  # kernels
        rounds = 0 if nodes == 1 else (2 if m == "ps" else 1)
        tcp, serve = 0.0, 0.0
        if host is not None and nodes > 1:
            serve = host.unit_cpu  # the serving thread's wake-up, handler and locks
            if m not in served:  # the first unit this iteration of the shard's or the SFB thread
                served.add(m)
                serve += host.thread_cpu
        if m == "sfb" and host is not None and host.sfb_contention is not None:
            cpu_s = (cpu_s + serve) * sfb_inflate  # the SFB thread's whole CPU, as its runs measured it
        else:
            cpu_s = cpu_s * inflate + serve  # the kernels slow as the compute's
        if host is not None and nodes > 1:
            per_blob = m == "ps" and bucket_bytes == 0
            frames = 4 * (nodes - 1) * (layers[unit[0]].blobs if per_blob else 1)  # sent + received
            tcp = host.transport_cpu(b, frames)  # this node's share of moving them
            cpu_kinds["transport"] += tcp
            if early[u]:
                tcp += host.wfbp_sync_cpu
                cpu_kinds["wfbp"] += host.wfbp_sync_cpu
        parts.append((b / 2, rounds * link.latency, tcp, cpu_s))
        nbytes += b
        cpu_kinds["sync"] += cpu_s
    rate = link.rate(nodes)
    tokens, t_tokens = link.burst, 0.0  # the shaper's bucket (bytes each way), full at the start

    def wire_time(u, start):
        """Unit u's time on the wire starting at ``start``: latency x round trips + its bytes
        at the rate; with a burst, the bytes the bucket holds pass at once (it refills at the
        link's rate while the link is idle)."""
        nonlocal tokens, t_tokens
        each_way, lat = parts[u][:2]
        if not each_way or math.isinf(rate):
            return lat
        if not link.burst:
            return lat + each_way / rate
        tokens = min(link.burst, tokens + (start - t_tokens) * rate)
        over = max(0.0, each_way - tokens)
        tokens = max(0.0, tokens - each_way)
        t_tokens = start + over / rate
        return lat + over / rate

    names = {l.name: m for l, m in zip(layers, methods) if m is not None}
    unit_names = ["+".join(layers[i].name for i in unit) for unit in units]
    if host is not None:
        if nodes > 1 and n:  # the rest of the process, once an iteration, on the compute lane
            fwd[0] += host.iteration_cpu
            cpu_kinds["process"] = host.iteration_cpu
        period, busy, events = shared_schedule(
            fwd,
            bwd,
            units,
            parts,
            wire_time,
            wfbp,
            host.cores / nodes,
            iterations,
            [l.name for l in layers],
            unit_names,
            drift=host.drift_at(nodes),
        )
        return Result(nodes, comm, wfbp, period, busy, nbytes, names, events, cpu_kinds)
    sync = [p[3] for p in parts]  # a node's own machine: the sync's CPU runs beside the compute
    if not cpu_overlap and n:
        fwd[0] += sum(sync)
    lowest = {min(unit): u for u, unit in enumerate(units)}  # a unit is ready after its lowest layer
    fresh = [0.0] * n  # when layer l's parameters for the next forward are in place
    t, comm_free = 0.0, 0.0
    starts, events = [], []
    for it in range(iterations):
        for i in range(n):
            s = max(t, fresh[i])
            if i == 0:
                starts.append(s)
            t = s + fwd[i]
            events.append(("compute", layers[i].name, s, t, it))
        queued = []
        for i in range(n - 1, -1, -1):
            s, t = t, t + bwd[i]
            events.append(("compute", layers[i].name, s, t, it))
            if i in lowest:
                queued.append((lowest[i], t))
        if not wfbp:
            queued = [(u, t) for u, _ in queued]  # everything waits for the whole backward
        for u, ready in queued:
            s = max(comm_free, ready)
            comm_free = s + wire_time(u, s) + sync[u]
            for i in units[u]:
                fresh[i] = comm_free
            if not early[u]:  # synced after the backward: the next iteration waits for it at once
                fresh[0] = max(fresh[0], comm_free)
            events.append(("comm", unit_names[u], s, comm_free, it))
        if not wfbp:
            fresh = [comm_free] * n  # the next iteration starts when every layer is synchronized
    period = (starts[-1] - starts[1]) / (len(starts) - 2)
    return Result(nodes, comm, wfbp, period, sum(fwd) + sum(bwd), nbytes, names, events, cpu_kinds)


def shared_schedule(fwd, bwd, units, parts, wire_time, wfbp, cores_per_node, iterations, names, unit_names, drift=0.0):
    """One node of P in lockstep on a machine they share: two lanes of CPU work, processor sharing.

    The compute lane runs forward 0..L-1, backward L-1..0 (``fwd``, ``bwd``: CPU seconds); the
    communication lane runs the ready sync units first come first served, each in two steps: its
    bytes on the wire (``wire_time``) while the transport's CPU (``parts[u][2]``) moves them (the
    step ends when both are done), then the serving thread's CPU (``parts[u][3]``: update or
    rebuild). At any moment each lane that has CPU work to do runs at min(1, cores per node /
    lanes busy) of a core: the P nodes do the same, so a node owns cores / P of the machine; a
    lane that only waits (for the wire, for a sync) leaves its share idle, as the nodes' threads
    do. ``drift``: each iteration's first forward starts that many seconds after it may, and
    meanwhile neither lane uses the CPU (the nodes out of step at BSP's barrier: the slowest
    node's last gradients are still to come, with WFBP too). -> (period, compute lane's seconds
    per iteration, events)."""
    n = len(fwd)
    lowest = {min(unit): u for u, unit in enumerate(units)}
    early = cost.starts_in_backward(units)
    order = [("f", i) for i in range(n)] + [("b", i) for i in range(n - 1, -1, -1)]
    synced = [-1] * len(units)  # the last iteration each unit has synchronized
    t, eps = 0.0, 1e-15
    it, step, left, began = 0, 0, None, 0.0  # the compute lane: iteration, position, CPU left, start
    queue, cur = [], None  # ready (iteration, unit); the unit in progress: [it, u, step, CPU left, wire end, start]
    starts, busy, events = [], [], []
    comp_busy = 0.0

    def waits(it_, i):
        """Forward of layer i in iteration it_ waits for the sync of the previous iteration."""
        if it_ == 0:
            return False
        if wfbp:  # each unit at the first layer that reads it; one synced after the backward at once
            return any((i in unit or (i == 0 and not early[u])) and synced[u] < it_ - 1 for u, unit in enumerate(units))
        return i == 0 and any(s < it_ - 1 for s in synced)

    barrier = None  # when the iteration's first forward may start (its drift from then on)
    while it < iterations:
        if left is None:  # the compute lane takes its next task where it may
            kind, i = order[step]
            if not (kind == "f" and waits(it, i)):
                if step == 0 and barrier is None:
                    barrier = t + drift
                if step != 0 or t >= barrier - eps:
                    left, began = (fwd if kind == "f" else bwd)[i], t
                    if step == 0:
                        starts.append(t)
                        barrier = None
        if cur is None and queue:
            cit, u = queue.pop(0)
            cur = [cit, u, 0, parts[u][2], t + wire_time(u, t), t]
        held = left is None and barrier is not None  # at the barrier: the node's CPU waits
        lanes = (left is not None and left > eps) + (cur is not None and cur[3] > eps and not held)
        speed = min(1.0, cores_per_node / lanes) if lanes else 0.0
        dt = math.inf
        if left is not None:
            dt = left / speed if left > eps else 0.0
        elif held:
            dt = max(barrier - t, 0.0)
        if cur is not None:
            if cur[3] > eps:
                if not held:
                    dt = min(dt, cur[3] / speed)
            elif cur[2] == 0:
                dt = min(dt, max(cur[4] - t, 0.0))
            else:
                dt = 0.0
        if math.isinf(dt):
            raise MinicaffeError("simulate: the schedule is stuck (a forward waits for a sync nobody runs)")
        t += dt
        if left is not None and left > eps:
            left -= speed * dt
            comp_busy += dt
        if cur is not None and cur[3] > eps and not held:
            cur[3] -= speed * dt
        if left is not None and left <= eps:  # a compute task ends
            kind, i = order[step]
            events.append(("compute", names[i], began, t, it))
            left = None
            ready = []
            if kind == "b" and wfbp and i in lowest:
                ready = [lowest[i]]
            elif kind == "b" and not wfbp and i == 0:
                ready = list(range(len(units)))
            queue.extend((it, u) for u in ready)
            step += 1
            if step == len(order):
                busy.append(comp_busy)
                comp_busy, step, it = 0.0, 0, it + 1
        if cur is not None and cur[3] <= eps and (cur[2] == 1 or t >= cur[4] - eps):
            if cur[2] == 0:  # on the wire and moved: the serving thread's CPU next
                cur[2], cur[3] = 1, parts[cur[1]][3]
            if cur[2] == 1 and cur[3] <= eps:
                synced[cur[1]] = cur[0]
                events.append(("comm", unit_names[cur[1]], cur[5], t, cur[0]))
                cur = None
    period = (starts[-1] - starts[1]) / (len(starts) - 2)
    return period, statistics.mean(busy[1:]), events


def one_node_time(layers):
    """One node alone: forward, backward and the update of every parameter, no network."""
    return sum(l.forward + l.backward + l.update for l in layers)


def speedup(layers, nodes, link, comm="hybrid", wfbp=True, compute_scale=1.0):
    r = simulate(layers, nodes, link, comm, wfbp, compute_scale=compute_scale)
    return nodes * one_node_time(layers) / r.period, r


# -- where per-layer times come from -------------------------------------------------------------


def layers_from_json(path):
    """Layers from a file: a list of {name, forward, backward (ms), count, m, n, k, update (ms)}."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as exc:
        raise MinicaffeError(f"--times {path}: cannot read it: {exc}") from None
    if isinstance(rows, dict):
        rows = rows.get("layers", [])
    out = []
    for j, r in enumerate(rows):
        try:
            out.append(
                Layer(
                    r["name"],
                    r["forward"] / 1e3,
                    r["backward"] / 1e3,
                    int(r.get("count", 0)),
                    r.get("m"),
                    r.get("n"),
                    r.get("k"),
                    r.get("update", 0.0) / 1e3,
                )
            )
        except (KeyError, TypeError) as exc:
            raise MinicaffeError(f"--times {path}: entry {j} needs name, forward and backward (ms): {exc}") from None
    if not out:
        raise MinicaffeError(f"--times {path}: no layers")
    return out


def save_times(layers, path):
    """Write layers as ``--times`` reads them (milliseconds), to edit (for a GPU, say) and read back."""
    rows = []
    for lay in layers:
        row = {"name": lay.name, "forward": lay.forward * 1e3, "backward": lay.backward * 1e3}
        if lay.count:
            row.update(count=lay.count, update=lay.update * 1e3)
        if lay.m is not None:
            row.update(m=lay.m, n=lay.n, k=lay.k)
        rows.append(row)
    try:
        with open(path, "w") as f:
            json.dump({"layers": rows}, f, indent=1)
    except OSError as exc:
        raise MinicaffeError(f"--save-times {path}: cannot write it: {exc}") from None


def update_seconds_per_param():
    """Measured: seconds per parameter of the SGD momentum update the CPU backend runs."""
    import time

    import numpy as np

    from .. import backend

    be = backend.get()
    w, g, h = (np.ones(1 << 24, np.float32) for _ in range(3))  # 64 MB each: memory, not cache
    be.sgd_step(w, g, h, 0.9, 0.01, 0.0005)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        be.sgd_step(w, g, h, 0.9, 0.01, 0.0005)
        best = min(best, time.perf_counter() - t)
    return best / w.size


def layers_from_net(net, iterations=10, warmup=3, workers=1):
    """Measure a Net's per-layer forward/backward (``python -m minicaffe.time``'s loop) on this
    machine; the geometry of each layer with parameters comes from the cost rule's plan."""
    from ..tools.timing import time_layers

    fwd, bwd, _ = time_layers(net, iterations, warmup)
    return layers_from_timings(net, fwd, bwd, workers)


def layers_from_timings(net, fwd, bwd, workers=1):
    """Layers from ``time_layers``' samples (each layer's median forward and backward seconds),
    with the geometry of each layer with parameters from the cost rule's plan and its update time
    measured here: what ``python -m minicaffe.time --save-times`` writes."""
    import statistics

    from .cost import plan

    per_param = update_seconds_per_param()
    geo = {c.index: c for c in plan(net, 2, workers=workers)}
    out = []
    for i, layer in enumerate(net.layers):
        c = geo.get(i)
        lay = Layer(layer.name, statistics.median(fwd[i]), statistics.median(bwd[i]))
        if c is not None:
            lay.count, lay.itemsize = c.count, c.itemsize
            lay.update = c.count * per_param
            if c.sfb_ok:
                lay.m, lay.n, lay.k = c.m, c.n, c.k
        out.append(lay)
    return out


# -- a stated GPU model: FLOPs from the prototxt's shapes ----------------------------------------


@dataclass
class GPU:
    name: str
    peak_flops: float  # FP32 FLOP/s
    efficiency: float  # the share of peak a cuDNN-era GEMM/convolution sustains
    memory_bandwidth: float  # bytes/s, for the layers that only stream memory
    launch: float = 20e-6  # seconds per layer pass (kernel launches and framework overhead)

    @property
    def sustained(self):
        return self.peak_flops * self.efficiency

    def __str__(self):
        return (
            f"{self.name}: {self.peak_flops / 1e12:g} TFLOP/s FP32 peak x {self.efficiency:g} = "
            f"{self.sustained / 1e12:.2f} TFLOP/s sustained, {self.memory_bandwidth / 1e9:g} GB/s"
        )


# Poseidon's ATC'17 cluster: one GeForce GTX Titan X (Maxwell, GM200) per node.
TITAN_X = GPU("NVIDIA GeForce GTX Titan X (Maxwell)", 6.6e12, 0.5, 336e9)


def _pair(p, name, default):
    """kernel/stride/pad as (h, w): ``<name>_h``/``_w`` when set, else the (repeated) ``<name>``."""
    if p.has(f"{name}_h") or p.has(f"{name}_w"):
        return int(getattr(p, f"{name}_h")), int(getattr(p, f"{name}_w"))
    v = getattr(p, "kernel_size" if name == "kernel" else name)
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None or (name == "kernel" and not p.has("kernel_size")):
        if default is None:
            raise MinicaffeError(f"simulate: {name} not given")
        v = default
    return int(v), int(v)


def flops_model(source, batch=None):
    """Per-layer shapes, parameters and FLOPs of a net prototxt, without building it.

    Returns [{name, type, forward_flops, backward_flops, bytes, count, m, n, k}] for ``batch``
    rows (default: the Data layer's batch_size); covers the layer types of AlexNet/VGG-style
    nets (Input, Data with a ``synthetic:CxHxW`` source, Convolution, Pooling, InnerProduct,
    ReLU, LRN, Dropout, Softmax, SoftmaxWithLoss, Accuracy), TRAIN phase.
    """
    from ..net import TRAIN, filter_layers, load_net_param

    param = load_net_param(source)
    shapes = {}
    for name, shape in zip(param.input, param.input_shape):
        shapes[name] = [batch or shape.dim[0]] + list(shape.dim)[1:]
    out = []
    for lp in filter_layers(param.layer, TRAIN):
        t = lp.type
        bottom = [shapes[b] for b in lp.bottom] if all(b in shapes for b in lp.bottom) else None
        if bottom is None:
            raise MinicaffeError(f"simulate: layer '{lp.name}' reads a blob of unknown shape {list(lp.bottom)}")
        row = dict(name=lp.name, type=t, forward_flops=0.0, backward_flops=0.0, bytes=0.0, count=0)
        if t == "Input":
            for top, s in zip(lp.top, lp.input_param.shape):
                shapes[top] = [batch or s.dim[0]] + list(s.dim)[1:]
            continue
        if t == "Data":
            src = lp.data_param.source
            if not src.startswith("synthetic:"):
                raise MinicaffeError(
                    f"simulate: layer '{lp.name}': its data shape is unknown ('{src}'); use synthetic data"
                )
            chw = [int(d) for d in src.split(":")[1].split("x")]
            b = batch or int(lp.data_param.batch_size)
            shapes[lp.top[0]] = [b] + chw
            if len(lp.top) > 1:
                shapes[lp.top[1]] = [b]
            continue
        x = bottom[0]
        if t == "Convolution":
            p = lp.convolution_param
            (kh, kw), (sh, sw), (ph, pw) = _pair(p, "kernel", None), _pair(p, "stride", 1), _pair(p, "pad", 0)
            cout, group = int(p.num_output), int(p.group or 1)
            oh, ow = (x[2] + 2 * ph - kh) // sh + 1, (x[3] + 2 * pw - kw) // sw + 1
            y = [x[0], cout, oh, ow]
            macs = x[0] * cout * oh * ow * (x[1] // group) * kh * kw
            row.update(forward_flops=2.0 * macs, backward_flops=4.0 * macs)
            row["count"] = cout * (x[1] // group) * kh * kw + (cout if p.bias_term else 0)
        elif t == "Pooling":
            p = lp.pooling_param
            if p.global_pooling:
                y = [x[0], x[1], 1, 1]
            else:
                (kh, kw), (sh, sw), (ph, pw) = _pair(p, "kernel", None), _pair(p, "stride", 1), _pair(p, "pad", 0)
                oh = -(-(x[2] + 2 * ph - kh) // sh) + 1
                ow = -(-(x[3] + 2 * pw - kw) // sw) + 1
                y = [x[0], x[1], oh, ow]
        elif t == "InnerProduct":
            p = lp.inner_product_param
            axis = int(p.axis) % len(x)
            rows, n = math.prod(x[:axis]), math.prod(x[axis:])
            m = int(p.num_output)
            y = list(x[:axis]) + [m]
            row.update(forward_flops=2.0 * rows * m * n, backward_flops=4.0 * rows * m * n)
            row.update(count=m * n + (m if p.bias_term else 0), m=m, n=n, k=rows)
        elif t in ("ReLU", "LRN", "Dropout", "Softmax", "TanH", "Sigmoid", "BatchNorm", "Scale"):
            y = list(x)
        elif t in ("SoftmaxWithLoss", "Accuracy", "EuclideanLoss"):
            y = [1]
        else:
            raise MinicaffeError(f"simulate: layer '{lp.name}' of type {t} has no shape rule in the FLOP model")
        row["bytes"] = 4.0 * (math.prod(x) + math.prod(y))  # read the input, write the output
        for top in lp.top:
            shapes[top] = y
        out.append(row)
    return out


def layers_from_gpu_model(source, batch, gpu=TITAN_X):
    """Per-layer seconds on ``gpu``: max(FLOPs / sustained FLOP/s, bytes / memory bandwidth) plus
    a launch cost; the update streams w, g, h (read) and w, h (written): 20 bytes a parameter."""
    out = []
    for r in flops_model(source, batch):
        f = max(r["forward_flops"] / gpu.sustained, r["bytes"] / gpu.memory_bandwidth) + gpu.launch
        b = max(r["backward_flops"] / gpu.sustained, 2 * r["bytes"] / gpu.memory_bandwidth) + gpu.launch
        lay = Layer(r["name"], f, b, r["count"], update=20.0 * r["count"] / gpu.memory_bandwidth)
        if r["type"] == "InnerProduct":
            lay.m, lay.n, lay.k = r["m"], r["n"], r["k"]
            lay.wgrad = r["forward_flops"] / gpu.sustained
        out.append(lay)
    return out


# -- tables and plots ----------------------------------------------------------------------------

MODES = [(c, w) for c in COMM_MODES for w in (False, True)]


def mode_name(comm, wfbp):
    return comm.upper() if comm != "hybrid" else "hybrid" + ("+WFBP" if wfbp else "")


def mode_label(comm, wfbp):
    return f"{comm}{'+WFBP' if wfbp else ''}"


def speedup_table(layers, nodes_list, link, compute_scale=1.0):
    """{(comm, wfbp): [(nodes, speedup, Result)]} for every mode."""
    return {(c, w): [(p, *speedup(layers, p, link, c, w, compute_scale)) for p in nodes_list] for c, w in MODES}


def format_speedups(title, table, published=None):
    nodes = [p for p, _, _ in next(iter(table.values()))]
    head = f"  {'nodes':>5}" + "".join(f" {mode_label(c, w):>12}" for c, w in table) + "   published"
    lines = [title, head]
    for j, p in enumerate(nodes):
        pub = (published or {}).get(p, "")
        lines.append(f"  {p:>5}" + "".join(f" {rows[j][1]:>11.2f}x" for rows in table.values()) + f"   {pub}")
    return "\n".join(lines)


def plot_speedups(panels, path):
    """panels: [(title, table)] -> one subplot per panel, speedup vs nodes per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, table) in zip(axes.ravel(), panels):
        nodes = [p for p, _, _ in next(iter(table.values()))]
        ax.plot(nodes, nodes, color="0.7", linestyle=":", label="linear")
        for (c, w), rows_ in table.items():
            ax.plot(
                nodes,
                [s for _, s, _ in rows_],
                marker="o" if w else "x",
                linestyle="-" if w else "--",
                color={"ps": "C0", "sfb": "C1", "hybrid": "C2"}[c],
                label=mode_label(c, w),
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("nodes")
        ax.set_ylabel("speedup")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(nodes, [str(p) for p in nodes])
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(result, path, iterations=2, title=""):
    """The compute and communication lanes of the last ``iterations`` simulated iterations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = max(e[4] for e in result.events)
    ev = [e for e in result.events if e[4] > last - iterations]
    t0 = min(e[2] for e in ev)
    names = []
    for e in ev:
        if e[1] not in names:
            names.append(e[1])
    colors = {n: f"C{j % 10}" for j, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 2.2))
    for lane, y in (("compute", 1), ("comm", 0)):
        for _, name, s, e, _ in (x for x in ev if x[0] == lane):
            ax.barh(y, (e - s) * 1e3, left=(s - t0) * 1e3, color=colors[name], edgecolor="k", linewidth=0.3)
    ax.set_yticks([0, 1], ["network", "compute"])
    ax.set_xlabel("ms")
    ax.set_title(title or f"{mode_name(result.comm, result.wfbp)}, {result.nodes} nodes", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names if n in result.methods]
    ax.legend(handles, [n for n in names if n in result.methods], fontsize=6, ncol=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- planning at a scale this machine cannot reach ----------------------------------------------

# What the papers report (see docs/POSEIDON.md for the sources and how they were measured).
PUBLISHED = {
    "alexnet": {8: "4.5x (arXiv 1512.06216, 8 nodes, Ethernet)"},
    "vgg16": {16: "VGG19-22K: 15.5x (ATC'17, 16 nodes, 10 GbE)"},
}
PLAN_NETS = (("alexnet", "caffenet_deploy", 256), ("vgg16", "vgg16_deploy", 32))


def plan(nodes_list=(1, 2, 4, 8, 16, 32), links=("10gbit", "40gbit"), latency="50us", gpu=TITAN_X, png=None, out=print):
    from ..tools.common import resolve_net

    out(f"Per-layer times: FLOPs / sustained FLOP/s of the {gpu}; one GPU per node.")
    panels = []
    for short, netname, batch in PLAN_NETS:
        layers = layers_from_gpu_model(resolve_net(netname), batch, gpu)
        t1 = one_node_time(layers)
        params = sum(l.count for l in layers)
        out(
            f"\n{short}: {params / 1e6:.1f}M parameters, batch {batch} per node, one node "
            f"{t1 * 1e3:.1f} ms per iteration ({batch / t1:.0f} images/s)"
        )
        for rate in links:
            link = Link(parse_rate(rate), parse_seconds(latency))
            table = speedup_table(layers, list(nodes_list), link)
            out(format_speedups(f"  speedup over one node, {link}:", table, PUBLISHED.get(short)))
            panels.append((f"{short}, {format_rate(link.bandwidth)}", table))
    if png:
        plot_speedups(panels, png)
        out(f"\nwrote {png}")
    return panels


# -- command line ---------------------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.dist.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a short name from nets/ or a prototxt (with --measure)")
    p.add_argument("--plan", action="store_true", help="AlexNet and VGG-16 on 1..32 GPU nodes, 10 and 40 Gbit/s")
    p.add_argument("--measure", action="store_true", help="time the model's layers on this machine first")
    p.add_argument(
        "--times",
        metavar="FILE",
        help="per-layer times from a JSON file instead: a list of {name, forward, backward (ms per "
        "iteration of one node); for a layer with parameters count (floats), update (ms); for an FC "
        "layer m, n, k (its M x N weight, K rows per node)}, as --save-times writes it",
    )
    p.add_argument("--save-times", metavar="FILE", help="with --measure: write the measured layers there (for --times)")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8], help="node counts (default 1 2 4 8)")
    p.add_argument("--bandwidth", nargs="+", default=["1gbit", "10gbit"], help="link rates, e.g. 1gbit 10gbit")
    p.add_argument("--latency", default="0.1ms", help="one-way latency (default 0.1ms)")
    p.add_argument("--cores", type=int, help="nodes share this many cores (compute slows by nodes / cores)")
    p.add_argument("--synthetic", action="store_true", help="Data layers read synthetic images (no download)")
    p.add_argument("--png", help="write the speedup plot here")
    p.add_argument("--timeline", help="write the timeline of hybrid+WFBP at the largest node count here")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.plan:
            plan(png=args.png)
            return 0
        if args.times:
            layers = layers_from_json(args.times)
        elif args.measure and args.model:
            from .. import proto
            from ..net import Net
            from ..parallel import with_synthetic_data
            from ..tools.common import resolve_net

            param = proto.parse_file(resolve_net(args.model, "train_test"), "NetParameter")
            if args.synthetic:
                param = with_synthetic_data(param, count=256)
            layers = layers_from_net(Net(param, "TRAIN"))
            if args.save_times:
                save_times(layers, args.save_times)
                print(f"wrote the measured layers to {args.save_times} (read them back with --times)")
        else:
            raise MinicaffeError("give --plan, --times FILE, or a model with --measure")
        if args.save_times and not args.measure:
            raise MinicaffeError("--save-times writes what --measure measured: give a model with --measure")
        one = sum(l.forward + l.backward + l.update for l in layers)
        print(f"one node: {one * 1e3:.1f} ms per iteration (forward + backward + update, {len(layers)} layers)")
        panels = []
        for rate in args.bandwidth:
            link = Link(parse_rate(rate), parse_seconds(args.latency))
            for p in args.nodes:
                if p < 1:
                    raise MinicaffeError(f"--nodes must be >= 1, got {p}")
            scale = (lambda p: max(1.0, p / args.cores)) if args.cores else (lambda p: 1.0)
            table = {(c, w): [(p, *speedup(layers, p, link, c, w, scale(p))) for p in args.nodes] for c, w in MODES}
            print(format_speedups(f"speedup over one node, {link}:", table))
            print(
                "  ms per iteration: "
                + ", ".join(
                    f"{mode_label(c, w)} " + "/".join(f"{r.period * 1e3:.1f}" for _, _, r in rows)
                    for (c, w), rows in table.items()
                )
            )
            panels.append((f"{args.model or args.times}, {format_rate(link.bandwidth)}", table))
            if args.timeline:
                res = simulate(layers, max(args.nodes), link, "hybrid", True, compute_scale=scale(max(args.nodes)))
                plot_timeline(res, args.timeline)
        if args.png:
            plot_speedups(panels, args.png)
        return 0
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
