"""Poseidon's HybComm cost rule: per layer, a parameter server (PS) or sufficient factors (SFB)?

A fully connected layer with an M x N weight (M outputs, N inputs) sees a batch of K rows per
node per iteration. Its weight gradient is a sum of K outer products, dW = sum_i u_i v_i^T with
u_i the top diff (M) and v_i the bottom data (N) of row i. Two ways to make every node's copy of
W see every node's gradient, counted in floats per iteration per node, sent plus received
(P1 worker nodes, P2 server shards, co-located; here P1 = P2 = P nodes):

    PS  = 2 M N (P1 + P2 - 2) / P2     push the gradient's shards to the servers, pull the
                                       fresh parameters back; as a server shard, receive the
                                       other workers' pushes and answer their pulls
    SFB = 2 K (P1 - 1) (M + N)         send u (K x M) and v (K x N) to every peer, receive
                                       theirs; each peer rebuilds sum_p U_p^T V_p itself

The rule picks SFB when SFB <= PS (Poseidon, arXiv 1512.06216, section 3.2). PS grows with
the layer's size, SFB with the batch and the number of peers, so the choice flips as P grows:
LeNet's ip1 (500 x 800, K = 64) is SFB on 2 to 8 nodes and PS from 16. Convolution layers, and
every other layer with parameters, always use PS: their gradient is not a sum of outer products
of two short vectors.

The rule is stated for the weight. A bias rides along for free with SFB (its gradient is the
column sum of u, which every peer already has) and costs 2 M (P1 + P2 - 2) / P2 floats with PS;
the predicted bytes printed below include it.

The rule counts bytes only. A run pays more per sync unit than its bytes' time on the wire: the
CPU of moving them (per byte and per frame, both ends), the frames of every unit (an SFB layer
between two parameter-server layers cuts their gradient bucket in two, adding 4 (P - 1) frames),
SFB's replicated work (every node rebuilds the whole gradient with one GEMM over every node's
factors and applies the whole update, where a PS shard updates 1/P of it), and the threads that
serve the units (the shard's server thread; with an SFB layer, the SFB thread too). ``choose``
keeps the rule as its core, the layers it sends by SFB are the only candidates, and keeps SFB
for those of them where the whole plan's estimated seconds per iteration (``unit_times``, with
``HostCosts``) say it pays; ``wfbp_auto`` decides ``--wfbp auto`` from the same estimate. The
runtime and the simulator both call them.

    python -m minicaffe.dist.cost lenet --nodes 4          # the per-layer choice and bytes
    python -m minicaffe.dist.cost lenet --nodes 2 4 8 16   # how the choice moves with P
"""

import argparse
import itertools
import sys
from dataclasses import dataclass, field

from ..errors import MinicaffeError

COMM_MODES = ("ps", "sfb", "hybrid")
# PyTorch DDP's ``bucket_cap_mb`` is 25 MB (1 MB for its first bucket); Caffe-sized nets want
# the overlap of several buckets more than DDP's large ones: 1 MiB makes LeNet's 8 blobs 2
# buckets (ip2 + ip1, conv2 + conv1) and CIFAR-10 quick's 10 blobs one, while every layer of
# AlexNet's classifier (16-151 MB) stays a bucket of its own
DEFAULT_BUCKET_BYTES = 1 << 20
DEFAULT_LINK_RATE = 10e9 / 8  # bytes/s each way the plan assumes where the link is not known: 10 Gbit/s


@dataclass(frozen=True)
class HostCosts:
    """What a node pays per sync unit beyond its bytes' time on the wire (``unit_times``).

    The defaults are this project's measurements on a 2-core x86 machine, rounded, as
    ``python benchmarks/poseidon.py --calibrate`` and ``--calibrate-runs`` wrote them into
    benchmarks/poseidon_calibration.json (``from_calibration`` reads them back; a test keeps
    the two within 5%): a byte moved through veth + bridge + tc costs 0.91 ns of CPU both ends
    together (linkcheck), a frame 79 us both ends in a LeNet training run (the median of the
    calls kept: the sender's and receiver's thread wake-ups on busy cores), the rebuild of
    LeNet's ip1 on 4 nodes (51 MFLOP) plus its update 0.59 ms (about 100 GFLOP/s and 50 GB/s of
    update traffic, 20 bytes per parameter), a sync started inside the backward (WFBP)
    154 us of thread switches (0-369 us over three calls), and the thread that serves the
    syncs (the shard's server thread; the SFB thread, a second one, where a plan has an SFB
    layer) 189 us per unit it serves (waking it, the frame handler, the locks) and 381 us per
    iteration of its own (LeNet's PS runs on loopback with 4 units and with 1, never a
    validated run; their sum 539-570 us over three calls). Constants, not the file itself:
    every node must make the same plan (the runs require it), and an installed package has no
    benchmarks/ to read."""

    cpu_per_byte: float = 0.91e-9
    cpu_per_frame: float = 79e-6
    gemm_flops: float = 100e9
    update_bytes_per_s: float = 50e9
    wfbp_sync_cpu: float = 154e-6
    unit_cpu: float = 189e-6  # the serving thread's CPU per sync unit beyond its kernels
    thread_cpu: float = 381e-6  # a serving thread's own CPU per iteration, where it serves any unit

    @classmethod
    def from_calibration(cls, doc):
        """The costs a calibration document (benchmarks/poseidon_calibration.json) measured: the
        per-byte CPU of the emulated cluster's path, and the medians over its training-run calls
        of a frame's, a WFBP sync's and the serving thread's CPU (per unit, per iteration); the
        GEMM and update rates stay the defaults."""
        import statistics

        calls = doc.get("run_calls") or [doc["frame_run"]]

        def med(key):
            return statistics.median(c[key] for c in calls)

        return cls(
            cpu_per_byte=doc["tcp"]["cpu_s_per_byte"],
            cpu_per_frame=med("cpu_s_per_frame"),
            wfbp_sync_cpu=med("wfbp_cpu_s_per_sync"),
            unit_cpu=med("unit_cpu_s"),
            thread_cpu=med("thread_cpu_s"),
        )


DEFAULT_HOST = HostCosts()


def ps_floats(m, n, p1, p2):
    """Poseidon's PS cost of an m x n matrix, floats per iteration per node (sent + received)."""
    return 2.0 * m * n * (p1 + p2 - 2) / p2


def sfb_floats(k, m, n, p1):
    """Poseidon's SFB cost of an m x n FC layer with k rows per node (sent + received)."""
    return 2.0 * k * (p1 - 1) * (m + n)


def plan_buckets(counts, ps_blobs, layer_of, itemsize, cap_bytes):
    """Gradient buckets: lists of consecutive blob indices, in layout order.

    Walks the parameter-server blobs from the last one back (the order the backward produces
    them, as PyTorch DDP's buckets); a bucket holds whole layers and closes at the first layer
    boundary where it has ``cap_bytes`` or more, or where the next blob is not a PS blob (a
    bucket is one contiguous range of the flat vectors: its frames need no copies).
    ``cap_bytes`` 0: one bucket per blob (no coalescing)."""
    ps = set(ps_blobs)
    buckets, cur, size = [], [], 0
    for i in sorted(ps, reverse=True):
        if cur:
            gap = i != cur[0] - 1
            full = cap_bytes == 0 or (size >= cap_bytes and layer_of[i] != layer_of[cur[0]])
            if gap or full:
                buckets.append(cur)
                cur, size = [], 0
        cur.insert(0, i)
        size += counts[i] * itemsize
    if cur:
        buckets.append(cur)
    return sorted(buckets)


@dataclass
class LayerCost:
    """One layer with learnable parameters and how it is synchronized.

    ``params``: indices into ``net.learnable_params``; ``m, n, k``: the FC geometry (None for
    other layers); ``ps_rule``/``sfb_rule``: the rule's floats for the weight alone;
    ``floats``: what the chosen method moves per iteration per node, bias included.
    """

    index: int
    name: str
    type: str
    params: list
    count: int
    m: int = None
    n: int = None
    k: int = None
    transpose: bool = False
    sfb_ok: bool = False
    reason: str = ""
    ps_rule: float = 0.0
    sfb_rule: float = None
    choice: str = "ps"
    floats: float = 0.0
    itemsize: int = 4
    rule_choice: str = "ps"  # what Poseidon's byte rule alone picks
    why: str = ""  # why the final choice (``choose``)
    blob_counts: list = field(default_factory=list)  # the sizes of the blobs in ``params``

    @property
    def bytes(self):
        return self.floats * self.itemsize


def layer_params(net):
    """Per layer index: [(learnable index, owns it?)] in the order of the layer's blobs."""
    out, flat, own = {}, 0, 0
    for i, layer in enumerate(net.layers):
        entries = []
        for _ in layer.blobs:
            owner = net.params_owner[flat]
            if owner is None:
                entries.append((own, True))
                own += 1
            else:
                entries.append((owner, False))
            flat += 1
        if entries:
            out[i] = entries
    return out


def sfb_eligibility(net, i, entries=None):
    """(True, '') if layer i can use SFB, else (False, why)."""
    layer = net.layers[i]
    if layer.type != "InnerProduct":
        what = "convolution" if layer.type in ("Convolution", "Deconvolution") else layer.type
        return False, f"{what}: gradient is not a sum of outer products"
    entries = entries if entries is not None else layer_params(net)[i]
    borrowed = any(not own for _, own in entries)
    lent = any(owner == k for k, _ in entries for owner in net.params_owner)
    if borrowed or lent:
        return False, "shares its parameters with another layer (param { name })"
    if net.params_lr[entries[0][0]] == 0:
        return False, "weight does not learn (lr_mult 0)"
    return True, ""


def plan(
    net,
    nodes,
    servers=None,
    comm="hybrid",
    workers=1,
    iter_size=1,
    global_batch=False,
    bucket_bytes=DEFAULT_BUCKET_BYTES,
    link_rate=None,
    host=DEFAULT_HOST,
):
    """The per-layer synchronization plan of ``net`` on ``nodes`` nodes: a list of LayerCost.

    ``workers`` threads per node and ``iter_size`` accumulate their rows into one node's batch,
    so K = rows per forward x workers x iter_size. ``global_batch``: the net's batch is the
    whole run's (as ``python -m minicaffe.train --nodes`` reads it), so a node has 1/P of it.
    ``bucket_bytes``, ``link_rate`` (bytes/s each way; None: DEFAULT_LINK_RATE) and ``host``
    go to ``choose``; ``host=None`` applies Poseidon's byte rule alone.
    """
    if comm not in COMM_MODES:
        raise MinicaffeError(f"--comm must be one of {', '.join(COMM_MODES)}, got '{comm}'")
    if nodes < 1:
        raise MinicaffeError(f"nodes must be >= 1, got {nodes}")
    p1, p2 = int(nodes), int(servers or nodes)
    itemsize = net.dtype.itemsize
    out = []
    for i, entries in layer_params(net).items():
        layer = net.layers[i]
        own = [k for k, mine in entries if mine]
        if not own or all(net.params_lr[k] == 0 for k in own):
            continue  # nothing to synchronize here (shared from elsewhere, or frozen)
        count = sum(net.learnable_params[k].count for k in own)
        lc = LayerCost(i, layer.name, layer.type, own, count)
        lc.blob_counts = [net.learnable_params[k].count for k in own]
        lc.itemsize = itemsize
        lc.sfb_ok, lc.reason = sfb_eligibility(net, i, entries)
        if layer.type == "InnerProduct":
            ipp = layer.param.inner_product_param
            lc.m, lc.transpose = int(ipp.num_output), bool(ipp.transpose)
            lc.n = net.learnable_params[own[0]].count // lc.m
            rows = net.top_vecs[i][0].count // lc.m
            lc.k = rows * workers * iter_size
            if global_batch:
                lc.k = -(-lc.k // p1)  # the largest node's share
            lc.ps_rule = ps_floats(lc.m, lc.n, p1, p2)
            lc.sfb_rule = sfb_floats(lc.k, lc.m, lc.n, p1)
        else:
            lc.ps_rule = ps_floats(count, 1, p1, p2)
        out.append(lc)
    return choose(out, p1, p2, comm, bucket_bytes, link_rate, host)


def layer_cost(index, name, count, m=None, n=None, k=None, blobs=2, itemsize=4):
    """A LayerCost from shapes alone (the simulator's layers): an InnerProduct when ``m`` is
    given (a weight of m x n and, with ``blobs`` 2, a bias of count - m n), else a layer that
    syncs through the parameter server (``blobs`` blobs of ``count`` parameters together)."""
    fc = m is not None
    if fc:
        counts = [m * n] + ([count - m * n] if blobs > 1 else [])
    else:
        counts = [count // max(blobs, 1)] * max(blobs, 1)
        counts[-1] += count - sum(counts)
    lc = LayerCost(index, name, "InnerProduct" if fc else "Convolution", list(range(len(counts))), count)
    lc.m, lc.n, lc.k, lc.itemsize, lc.blob_counts = m, n, k, itemsize, counts
    lc.sfb_ok, lc.reason = (True, "") if fc else (False, "not an InnerProduct layer")
    return lc


def _rule(c, p1, p2):
    """(PS floats, SFB floats or None) of layer c by Poseidon's rule, for the weight."""
    if c.m is None:
        return ps_floats(c.count, 1, p1, p2), None
    return ps_floats(c.m, c.n, p1, p2), sfb_floats(c.k, c.m, c.n, p1)


def sync_units(costs, sfb, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """What synchronizes on its own, in the order the backward makes it ready (last layer
    first): [(layers, method, floats)], each SFB layer (``sfb``: their names) alone, the other
    layers in the parameter server's gradient buckets (``plan_buckets``, as the runtime plans
    them); ``floats``: the parameters a bucket holds (None for an SFB layer)."""
    counts, layer_of, ps_blobs = [], [], []
    for c in costs:
        for n in c.blob_counts or [c.count]:
            if c.name not in sfb:
                ps_blobs.append(len(counts))
            counts.append(n)
            layer_of.append(c.index)
    by_index = {c.index: c for c in costs}
    units = [([c], "sfb", None) for c in costs if c.name in sfb]
    for bucket in plan_buckets(counts, ps_blobs, layer_of, costs[0].itemsize if costs else 4, bucket_bytes):
        layers = [by_index[i] for i in sorted({layer_of[b] for b in bucket})]
        units.append((layers, "ps", sum(counts[b] for b in bucket)))
    return sorted(units, key=lambda u: -max(c.index for c in u[0]))


def starts_in_backward(unit_layers):
    """WFBP: which units' syncs start inside the backward. ``unit_layers``: the layer indices of
    each unit -> a bool per unit: every one but those holding the lowest layer that
    synchronizes. Theirs can only start once the whole backward is done, as without WFBP, so
    the runtime synchronizes them exactly as without it (pushed and waited for after the
    backward): on a one-unit plan WFBP changes nothing and costs nothing."""
    if not unit_layers:
        return []
    low = min(min(layers) for layers in unit_layers)
    return [low not in layers for layers in unit_layers]


def _early_units(costs, sfb, bucket_bytes):
    units = sync_units(costs, sfb, bucket_bytes)
    return sum(starts_in_backward([[c.index for c in u[0]] for u in units]))


def wfbp_gradient_slots(costs, staleness, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """The gradient slots a node with WFBP needs (``Node(gradient_slots=...)``): staleness + 2
    where some unit's sync starts inside the backward (the next clock's gradients go to
    another slot while this clock's may still be on their way), else None (the Node's own
    staleness + 1, as without WFBP)."""
    sfb = {c.name for c in costs if c.choice == "sfb"}
    return int(staleness) + 2 if _early_units(costs, sfb, bucket_bytes) else None


def unit_times(costs, sfb, nodes, servers=None, bucket_bytes=DEFAULT_BUCKET_BYTES, link_rate=None, host=DEFAULT_HOST):
    """The sync units of a plan (``sync_units``) and what each costs one node per iteration, in
    the order the backward makes them ready (last layer first): a list of dicts with ``layers``
    (their names), ``method``, ``bytes`` (sent + received), ``frames`` (sent + received),
    ``wire_s`` (the bytes each way over ``link_rate``), ``cpu_s`` (moving them: per byte and
    per frame, this node's half of both ends), ``work_s`` (the update's, and SFB's rebuild minus
    the node's own dW GEMM that it skips), ``serve_s`` (the serving thread's: ``host.unit_cpu``,
    and ``host.thread_cpu`` on the first unit of each method, the shard's server thread and the
    SFB thread being two threads, as the simulator charges them) and ``seconds`` = max(wire,
    cpu) + work + serve (moving bytes takes at least its CPU). ``sfb``: the names of the layers
    synchronized by SFB; every other one goes to the parameter server in gradient buckets (the
    runtime's ``plan_buckets``)."""
    p1, p2 = int(nodes), int(servers or nodes)
    rate = link_rate or DEFAULT_LINK_RATE
    frames = 4 * (p1 - 1)
    units = []
    for layers, method, n in sync_units(costs, sfb, bucket_bytes):
        if method == "sfb":
            c = layers[0]
            floats = sfb_floats(c.k, c.m, c.n, p1)
            ktot = c.k * p1
            work = (2.0 * ktot * c.m * c.n - 2.0 * c.k * c.m * c.n) / host.gemm_flops
            work += 20.0 * c.count / host.update_bytes_per_s
            units.append((layers, "sfb", floats * c.itemsize, work))
        else:
            units.append(
                (layers, "ps", ps_floats(n, 1, p1, p2) * layers[0].itemsize, 20.0 * n / p2 / host.update_bytes_per_s)
            )
    out, served = [], set()
    for layers, method, nbytes, work in units:
        f = frames if p1 > 1 else 0
        wire = nbytes / 2 / rate if p1 > 1 else 0.0
        cpu = nbytes / 2 * host.cpu_per_byte + f / 2 * host.cpu_per_frame if p1 > 1 else 0.0
        work = work if p1 > 1 or method == "ps" else 0.0
        serve = 0.0
        if p1 > 1:
            serve = host.unit_cpu + (host.thread_cpu if method not in served else 0.0)
            served.add(method)
        out.append(
            {
                "layers": [c.name for c in layers],
                "method": method,
                "bytes": nbytes,
                "frames": f,
                "wire_s": wire,
                "cpu_s": cpu,
                "work_s": work,
                "serve_s": serve,
                "seconds": max(wire, cpu) + work + serve,
            }
        )
    return out


def _total(units):
    return sum(u["seconds"] for u in units)


def choose(
    costs, nodes, servers=None, comm="hybrid", bucket_bytes=DEFAULT_BUCKET_BYTES, link_rate=None, host=DEFAULT_HOST
):
    """Set each LayerCost's ``rule_choice`` (Poseidon's byte rule), ``choice``, ``why`` and
    ``floats``; -> ``costs``.

    ``comm`` 'ps' or 'sfb' force the method (SFB where the layer allows it). 'hybrid': the
    rule's SFB layers are the candidates; of every subset of them (greedy flips past 12) the
    plan with the fewest estimated seconds per iteration (``unit_times``: wire, the CPU of
    bytes and frames, buckets, the rebuild, the serving threads) wins, the rule's own pick on a
    tie; ``why`` says by how much, term by term. ``host=None``: the byte rule alone."""
    if comm not in COMM_MODES:
        raise MinicaffeError(f"--comm must be one of {', '.join(COMM_MODES)}, got '{comm}'")
    p1, p2 = int(nodes), int(servers or nodes)
    for c in costs:
        c.ps_rule, c.sfb_rule = _rule(c, p1, p2)
        c.rule_choice = "sfb" if c.sfb_ok and c.sfb_rule <= c.ps_rule else "ps"
    if comm != "hybrid":
        for c in costs:
            c.choice = "sfb" if comm == "sfb" and c.sfb_ok else "ps"
            c.why = f"--comm {comm}" if c.sfb_ok else c.reason
    else:
        cands = [c.name for c in costs if c.rule_choice == "sfb"]
        for c in costs:
            c.choice = c.rule_choice
            c.why = "byte rule: SFB <= PS" if c.rule_choice == "sfb" else (c.reason or "byte rule: PS < SFB")
        if host is not None and cands and p1 > 1:

            def t(chosen):
                return _total(unit_times(costs, set(chosen), p1, p2, bucket_bytes, link_rate, host))

            if len(cands) <= 12:
                subsets = (s for r in range(len(cands), -1, -1) for s in itertools.combinations(cands, r))
                best = min(subsets, key=t)  # (min keeps the first of equals: the larger subset)
            else:
                best, better = list(cands), True
                while better:
                    better = False
                    for name in list(best):
                        trial = [x for x in best if x != name]
                        if t(trial) < t(best):
                            best, better = trial, True

            def parts(chosen):  # seconds: moving the bytes (wire or CPU), update + rebuild, serving threads
                units = unit_times(costs, set(chosen), p1, p2, bucket_bytes, link_rate, host)
                moving = sum(max(u["wire_s"], u["cpu_s"]) for u in units)
                return moving, sum(u["work_s"] for u in units), sum(u["serve_s"] for u in units)

            best_t = t(best)
            for c in costs:
                if c.name not in cands:
                    continue
                flipped = [x for x in best if x != c.name] if c.name in best else list(best) + [c.name]
                other_t = t(flipped)
                with_sfb, with_ps = (best, flipped) if c.name in best else (flipped, best)
                d = [a - b for a, b in zip(parts(with_sfb), parts(with_ps))]
                terms = (
                    f"SFB: bytes + frames {1e3 * d[0]:+.2f}, update + rebuild {1e3 * d[1]:+.2f}, "
                    f"serving threads {1e3 * d[2]:+.2f} ms"
                )
                if c.name in best:
                    c.choice = "sfb"
                    c.why = (
                        f"byte rule SFB; plan with SFB {1e3 * best_t:.2f} ms <= PS {1e3 * other_t:.2f} ms/iteration "
                        f"({terms})"
                    )
                else:
                    c.choice = "ps"
                    c.why = (
                        f"byte rule SFB, but SFB does not pay here: plan with PS {1e3 * best_t:.2f} ms < "
                        f"SFB {1e3 * other_t:.2f} ms/iteration ({terms})"
                    )
    for c in costs:
        c.floats = c.sfb_rule if c.choice == "sfb" else ps_floats(c.count, 1, p1, p2)
    return costs


def wfbp_auto(
    costs, nodes, busy, cores, servers=None, bucket_bytes=DEFAULT_BUCKET_BYTES, link_rate=None, host=DEFAULT_HOST
):
    """``--wfbp auto``: -> (on?, why). ``busy``: the compute threads on this machine (node
    processes x worker threads), ``cores`` its cores; ``costs``: the plan (``choose``).

    WFBP starts each unit's sync inside the backward. What it can hide is the sync time that
    would otherwise follow the backward: without WFBP the units pipeline among themselves after
    it, max(all wire time, all CPU of the syncs); with it, where the node has no spare core
    (its compute thread keeps one busy), the syncs' CPU still has to run on that core and only
    wire time hides: max(all CPU, the last unit's wire time); with a spare core for every
    compute thread, everything but the last unit hides. It costs ``host.wfbp_sync_cpu`` per
    unit whose sync starts inside the backward (thread switches; ``starts_in_backward``: the
    units holding the lowest layer are synchronized as without WFBP, at no cost). On where the
    gain is larger; off with no core per compute thread."""
    if nodes < 2:
        return False, "auto: one node"
    if busy > cores:
        return False, f"auto: {busy} busy threads on {cores} cores leave nothing to overlap"
    sfb = {c.name for c in costs if c.choice == "sfb"}
    units = unit_times(costs, sfb, nodes, servers, bucket_bytes, link_rate, host)
    if not units:
        return False, "auto: nothing to synchronize"
    wire = sum(u["wire_s"] for u in units)
    cpu = sum(u["cpu_s"] + u["work_s"] + u["serve_s"] for u in units)
    last = units[-1]
    without = max(wire, cpu)
    if cores >= 2 * busy:
        with_ = last["seconds"]
    else:
        with_ = max(cpu, last["wire_s"])
    early = _early_units(costs, sfb, bucket_bytes)
    gain, price = without - with_, early * host.wfbp_sync_cpu
    rate = (link_rate or DEFAULT_LINK_RATE) * 8 / 1e9
    verdict = "on" if gain > price else "off"
    return gain > price, (
        f"auto: {verdict}: overlap hides up to {1e3 * gain:.2f} ms per iteration, its {early} sync{'' if early == 1 else 's'} "
        f"inside the backward cost "
        f"{1e3 * price:.2f} ms of CPU (link {rate:g} Gbit/s{'' if link_rate else ' assumed'}, "
        f"{busy} busy thread(s) on {cores} cores)"
    )


def _num(x):
    return "-" if x is None else f"{x:,.0f}"


def format_plan(costs, nodes, servers=None, comm="hybrid"):
    """The start-up table: one line per layer with the rule's numbers, the byte rule's pick, the
    final choice, and why (where the two differ, or a layer cannot use SFB)."""
    p2 = servers or nodes
    lines = [
        f"HybComm plan ({comm}): P1 = {nodes} worker nodes, P2 = {p2} server shards; "
        "floats per iteration per node, sent + received",
        f"  {'layer':<10} {'type':<13} {'M':>6} {'N':>6} {'K':>5} {'PS (rule)':>13} {'SFB (rule)':>13}"
        f"  {'rule':<4} {'choice':<6} {'predicted':>11}",
    ]
    total = 0.0
    for c in costs:
        if c.choice != c.rule_choice or not c.sfb_ok:
            why = f"  ({c.why or c.reason})"
        else:
            why = ""
        lines.append(
            f"  {c.name:<10} {c.type:<13} {_num(c.m):>6} {_num(c.n):>6} {_num(c.k):>5} {_num(c.ps_rule):>13} "
            f"{_num(c.sfb_rule):>13}  {c.rule_choice.upper():<4} {c.choice.upper():<6} {c.bytes / 1e6:>8.3f} MB{why}"
        )
        total += c.bytes
    lines.append(f"  total {total / 1e6:.3f} MB per iteration per node (weights and biases; headers not counted)")
    for c in costs:
        if c.choice == c.rule_choice == "sfb" and comm == "hybrid" and "plan" in c.why:
            lines.append(f"  {c.name}: {c.why}")
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minicaffe.dist.cost", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a short name from nets/ or a net prototxt")
    p.add_argument("--nodes", type=int, nargs="+", default=[4], help="P1 = P2 = nodes (several values: one table each)")
    p.add_argument("--comm", choices=COMM_MODES, default="hybrid")
    p.add_argument("--workers", type=int, default=1, help="threads per node (their rows add up to K)")
    p.add_argument(
        "--batch-per-node",
        action="store_true",
        help="the net's batch is each node's K (Poseidon's convention); by default it is the whole "
        "run's batch, split over the nodes as python -m minicaffe.train --nodes does",
    )
    p.add_argument(
        "--link", help="the link rate to plan with (e.g. 1gbit; default: 10gbit assumed, as a run without --link)"
    )
    p.add_argument("--bytes-only", action="store_true", help="Poseidon's byte rule alone (no per-unit costs)")
    p.add_argument("--synthetic", action="store_true", help="Data layers read synthetic images (no download)")
    return p


def main(argv=None):
    from .. import proto
    from ..net import Net
    from ..parallel import with_synthetic_data
    from ..tools.common import resolve_net
    from .transport import parse_rate

    args = build_parser().parse_args(argv)
    try:
        rate = parse_rate(args.link) if args.link else None
        param = proto.parse_file(resolve_net(args.model, "train_test"), "NetParameter")
        if args.synthetic:
            param = with_synthetic_data(param, count=256)
        net = Net(param, "TRAIN")
        for nodes in args.nodes:
            costs = plan(
                net,
                nodes,
                comm=args.comm,
                workers=args.workers,
                global_batch=not args.batch_per_node,
                link_rate=rate,
                host=None if args.bytes_only else DEFAULT_HOST,
            )
            print(format_plan(costs, nodes, comm=args.comm))
            print()
        return 0
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
