"""Wait-free backprop and hybrid communication on real loopback sockets, nodes as threads:
every mode computes what one process computes (BSP, Caffe's LeNet solver), SFB replicas are
bitwise identical after every update, measured bytes follow the cost rule, SSP and worker
threads work, and what cannot work is refused clearly."""

import threading
import time

import numpy as np
import pytest

from minicaffe import proto
from minicaffe.dist import cost, timeline
from minicaffe.dist import frames as F
from minicaffe.dist.poseidon import Poseidon
from minicaffe.dist.ps import Node, plan_buckets
from minicaffe.dist.sockets import SocketTransport
from minicaffe.errors import MinicaffeError
from minicaffe.parallel import blas, with_synthetic_data
from minicaffe.solvers import get_solver
from minicaffe.tools.common import resolve_net, resolve_solver

SECRET = b"poseidon-test-secret"


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread_per_node():
    """The nodes here are threads of this one process: one BLAS thread each, as the launcher gives
    each node process (launch.blas_threads). OpenBLAS's threads spin while they wait; several
    nodes' spinning threads on two cores slowed a LeNet iteration from ~8 to ~300 ms."""
    old = blas.get_threads()
    if old is not None:
        blas.set_threads(1)
    yield
    if old is not None:
        blas.set_threads(old)


def lenet_solver(iters, **fields):
    """Caffe's LeNet solver (momentum 0.9, decay 5e-4, inv policy) on seeded synthetic digits."""
    p = proto.parse_file(resolve_solver("lenet"), "SolverParameter")
    p.clear("net")
    p.net_param = with_synthetic_data(proto.parse_file(resolve_net("lenet", "train_test"), "NetParameter"), 512)
    p.clear("test_iter")
    p.test_interval, p.display, p.snapshot, p.snapshot_after_train, p.max_iter = 0, 0, 0, False, iters
    for k, v in fields.items():
        setattr(p, k, v)
    return get_solver(p, log=lambda m: None)


def mesh(world, limit, cls=SocketTransport):
    quiet = lambda m: None
    t0 = cls(0, world, "127.0.0.1:0", SECRET, {"net": "lenet"}, limit, log=quiet)
    rdv = f"127.0.0.1:{t0.address[1]}"
    ts = [t0] + [cls(r, world, rdv, SECRET, {"net": "lenet"}, limit, log=quiet) for r in range(1, world)]
    threads = [threading.Thread(target=t.form) for t in ts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return ts


def run(
    world,
    comm,
    wfbp,
    iters=3,
    staleness=0,
    workers=1,
    watch=None,
    resume=None,
    bucket_bytes=None,
    transport=None,
    setup=None,
    **fields,
):
    """Train ``world`` nodes in threads; -> (solvers, nodes, poseidons). ``watch(rank, pos,
    solver)`` runs after every iteration on every node; ``setup(nodes, poseidons)`` once before
    they start; node 0 alone snapshots, and restores ``resume`` (a .solverstate) first when given."""
    solvers = [lenet_solver(iters, **fields) for _ in range(world)]
    for s in solvers[1:]:
        s.param.snapshot, s.param.snapshot_after_train = 0, False
    if resume:
        solvers[0].restore(resume)
    ts = mesh(world, 1 << 22, transport or SocketTransport)
    slots = None
    if wfbp:  # as the launcher: a second slot where some unit syncs inside the backward
        cap = cost.DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
        costs = cost.plan(solvers[0].net, world, comm=comm, workers=workers, global_batch=True, bucket_bytes=cap)
        slots = cost.wfbp_gradient_slots(costs, staleness, cap)
    nodes = [
        Node(
            s,
            t,
            staleness=staleness,
            workers=workers,
            gradient_slots=slots,
            resume=bool(resume) and r == 0,
            bucket_bytes=bucket_bytes,
        )
        for r, (s, t) in enumerate(zip(solvers, ts))
    ]
    logs = [[] for _ in range(world)]
    try:
        pos = [Poseidon(n, comm, wfbp, log=logs[n.rank].append) for n in nodes]
    except BaseException:
        for t in ts:
            t.shutdown()
        raise
    if setup is not None:
        setup(nodes, pos)
    errors = {}

    def go(r):
        s, node = solvers[r], nodes[r]
        try:
            if watch is not None:
                s.on_iteration.append(lambda solver, loss, lr: watch(r, pos[r], solver))
            node.attach_solver()
            node.start()
            s.step(iters - s.iter)
            node.reports = node.finish()
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            errors[r] = exc
            node.abort()
        finally:
            pos[r].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[min(errors)]
    pos[0].logs = logs[0]
    return solvers, nodes, pos


def reference(iters):
    s = lenet_solver(iters)
    s.step(iters)
    return [p.data.copy() for p in s.net.learnable_params]


def assert_matches(solver, want, tol=1e-4):
    for i, (p, w) in enumerate(zip(solver.net.learnable_params, want)):
        err = float(np.max(np.abs(p.data - w)) / max(float(np.max(np.abs(w))), 1e-12))
        assert err < tol, f"blob {i} {p.shape}: relative difference {err:.3g} > {tol}"


@pytest.fixture(scope="module")
def bsp_reference():
    return reference(3)


@pytest.mark.parametrize(
    "world,comm,wfbp,workers",
    [
        (2, "hybrid", True, 1),
        (2, "ps", True, 1),
        (2, "sfb", False, 1),
        pytest.param(3, "hybrid", False, 2, marks=pytest.mark.slow),  # uneven shards, 2 workers: ~10 s each
        pytest.param(3, "sfb", True, 2, marks=pytest.mark.slow),
    ],
)
def test_every_mode_computes_what_one_process_computes(bsp_reference, world, comm, wfbp, workers):
    digests = {}

    def watch(rank, pos, solver):  # after every update: the SFB layers of every node
        pos.wait_all(solver.iter)
        for i in pos.sfb_blobs:
            digests.setdefault((solver.iter, i), {})[rank] = solver.net.learnable_params[i].data.tobytes()

    solvers, nodes, pos = run(world, comm, wfbp, workers=workers, watch=watch)
    assert pos[0].fused_sgd  # Caffe's LeNet solver: plain SGD, L2 decay
    for s in solvers:
        assert_matches(s, bsp_reference)
    want_sfb = {"ps": [], "hybrid": ["ip1"], "sfb": ["ip1", "ip2"]}[comm]
    assert sorted(l.name for l in pos[0].sfb.values()) == want_sfb
    assert len(digests) == 3 * 2 * len(want_sfb)
    for key, per_node in digests.items():
        assert len(per_node) == world and len(set(per_node.values())) == 1, f"replicas differ at {key}"
    # measured bytes per layer per iteration: the cost rule plus 48 bytes per frame
    for p in pos:
        measured = p.measured_bytes(3)
        for name, (rule, headers) in p.predicted_bytes().items():
            assert abs(measured[name] - (rule + headers)) <= 0.05 * (rule + headers), (p.rank, name)


# LeNet's learnable blobs: conv1 w b, conv2 w b, ip1 w b, ip2 w b
LENET_COUNTS = [500, 20, 25000, 50, 400000, 500, 5000, 10]
LENET_LAYER = [1, 1, 3, 3, 5, 5, 7, 7]


def test_bucket_plan():
    """Buckets hold whole layers, consecutive in the flat vector, closed at the first layer
    boundary past the cap (walking from the last layer back) or at a blob the shards do not serve."""
    every = range(8)
    assert plan_buckets(LENET_COUNTS, every, LENET_LAYER, 4, 0) == [[i] for i in every]
    assert plan_buckets(LENET_COUNTS, every, LENET_LAYER, 4, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # 1 MiB: ip2 (20 KB) is too small alone, ip2 + ip1 (1.6 MB) closes; conv1 + conv2 are the rest
    assert plan_buckets(LENET_COUNTS, every, LENET_LAYER, 4, 1 << 20) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plan_buckets(LENET_COUNTS, every, LENET_LAYER, 4, 1 << 30) == [list(every)]
    # hybrid on LeNet: ip1 synchronizes itself (SFB), so ip2 cannot share a bucket with conv2
    assert plan_buckets(LENET_COUNTS, [0, 1, 2, 3, 6, 7], LENET_LAYER, 4, 1 << 20) == [[0, 1, 2, 3], [6, 7]]


@pytest.mark.parametrize(
    "world,comm,wfbp,cap",
    [(2, "ps", True, 0), (2, "ps", False, 1), pytest.param(3, "hybrid", True, 1 << 30, marks=pytest.mark.slow)],
)
def test_buckets_compute_what_one_process_computes(bsp_reference, world, comm, wfbp, cap):
    """Any cap (0: every blob alone, 1 byte: every layer alone, 1 GiB: one bucket) trains exactly
    as one process; one GRAD and one PARAM frame per bucket and peer; bytes follow the cost rule
    (bucketing changes the headers only)."""
    solvers, nodes, pos = run(world, comm, wfbp, bucket_bytes=cap)
    for s in solvers:
        assert_matches(s, bsp_reference)
    for node, p in zip(nodes, pos):
        want = plan_buckets(LENET_COUNTS, node.ps_blobs, LENET_LAYER, 4, cap)
        assert sorted(node.buckets.values()) == want
        st = node.transport.stats
        for kind in ("GRAD", "PARAM"):
            assert {key for k, key in list(st.sent) + list(st.received) if k == kind} == {b[0] for b in want}
        measured = p.measured_bytes(3)
        for name, (rule, headers) in p.predicted_bytes().items():
            assert abs(measured[name] - (rule + headers)) <= 0.05 * (rule + headers), (p.rank, name)


class GradOrder(SocketTransport):
    """A transport that logs, on the thread that sends it, the clock of every GRAD frame; a
    Solver callback (``ReadyMark``) adds where each clock's backward ended."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order = []

    def send(self, dst, kind, key, clock, array=None, payload=None):
        if kind == F.GRAD:
            self.order.append(("GRAD", clock))
        super().send(dst, kind, key, clock, array, payload)


class ReadyMark:
    def __init__(self, order):
        self.order = order

    def on_gradients_ready(self, solver):
        self.order.append(("ready", solver.iter))


def grad_order(cap, wfbp, world=2, iters=3):
    """LeNet over the parameter server with bucket cap ``cap``: -> (solvers, nodes, poseidons,
    per node {clock: [GRAD frames sent before its backward ended, after]})."""

    def mark(nodes, pos):
        for node in nodes:
            node.solver.add_callback(ReadyMark(node.transport.order))

    solvers, nodes, pos = run(world, "ps", wfbp, iters=iters, bucket_bytes=cap, transport=GradOrder, setup=mark)
    counts = []
    for node in nodes:
        per, ended = {}, set()
        for what, clock in node.transport.order:
            if what == "ready":
                ended.add(clock)
            else:
                per.setdefault(clock, [0, 0])[clock in ended] += 1
        counts.append(per)
    return solvers, nodes, pos, counts


def test_wfbp_on_a_one_unit_plan_is_the_schedule_without_it():
    """Where the whole net is one unit (LeNet in one 4 MiB bucket, as CIFAR-10 quick in its 1 MiB
    one), its sync can only start after the whole backward: WFBP on runs exactly the schedule
    without it. No gradient leaves before the backward has ended (the old runtime pushed it from
    conv1's hook), no forward waits in a hook, one gradient slot, and the same numbers bit for bit."""
    runs = {wfbp: grad_order(4 << 20, wfbp) for wfbp in (False, True)}
    for wfbp, (solvers, nodes, pos, counts) in runs.items():
        for node, p, per in zip(nodes, pos, counts):
            assert len(node.buckets) == 1 and node.n_slots == 1 and node.hooked_blobs == set()
            assert p.early_units == 0 and p.wait_at == {} and p.report(3)["syncs_in_backward"] == 0
            assert per == {c: [0, 1] for c in range(3)}, (wfbp, per)  # one GRAD to the peer, after the backward
    for a, b in zip(runs[False][0][0].net.learnable_params, runs[True][0][0].net.learnable_params):
        assert np.array_equal(a.data, b.data)


def test_wfbp_syncs_inside_the_backward_every_unit_but_the_lowest():
    """Every blob its own bucket (cap 0): the six buckets above conv1 push from their layers'
    hooks, before the backward ends, and the next forward waits for each at the first layer
    that reads it; conv1's two can only start after the backward, so they go as without WFBP
    (pushed and waited for in the Node's sync()). Training is still exactly one process's."""
    solvers, nodes, pos, counts = grad_order(0, True)
    for node, p, per in zip(nodes, pos, counts):
        names = p.replicas[0].layer_names
        assert p.early_units == 6 and node.n_slots == 2
        assert sorted(names[l] for l in p.early) == ["conv2", "ip1", "ip2"]
        assert sorted(names[l] for l in p.wait_at) == ["conv2", "ip1", "ip2"]
        assert sorted(node.synced_here) == [0, 1]  # conv1's weight and bias
        assert per == {c: [6, 2] for c in range(3)}, per
    want = reference(3)
    for s in solvers:
        assert_matches(s, want)


class OrderChecked(SocketTransport):
    """A transport that checks, as each PARAM frame leaves, that the shard has already marked
    its own state: the slice's version, and the clock as applied once every bucket is."""

    problems = []

    def start(self, handler):
        self.node = handler
        super().start(handler)

    def send(self, dst, kind, key, clock, array=None, payload=None):
        node = getattr(self, "node", None)
        if kind == F.PARAM and node is not None:
            with node.cv:
                mine = [node.versions[i, node.rank] for b in node.served for i in node.buckets[b]]
                if any(node.versions[i, node.rank] < clock for i in node.buckets[key]):
                    self.problems.append(f"PARAM {key} of version {clock} left before its slice was marked")
                if min(mine) >= clock and node.server_version < clock:
                    self.problems.append(f"the last PARAM of version {clock} left before the clock was applied")
        super().send(dst, kind, key, clock, array, payload)


def test_a_shard_marks_its_update_before_the_parameters_leave():
    """Regression: a node holding every slice of version c + 1 pushes clock c + 1 at once; a
    shard that sent its last PARAM before marking clock c as applied (and lost the core in
    between, as under load) refused that gradient ("gradient of clock c + 1 while this shard is
    at version c") and stopped the run."""
    OrderChecked.problems = []
    for cap in (0, None):
        run(2, "ps", True, bucket_bytes=cap, transport=OrderChecked)
    assert not OrderChecked.problems, OrderChecked.problems[:3]


def smooth_lenet(lr_mult=1.0, decay_mult=1.0):
    """LeNet's training net (synthetic digits) made smooth, ReLU -> TanH and MAX -> AVE pooling,
    with ip1's weight at its own lr_mult and decay_mult.  Two runs that round differently (one
    process against two nodes) follow the same trajectory only while no kink is crossed: with
    ReLU, ip1's weight at x3 and a decay of 0.05, one unit of ip1 sat within rounding of zero at
    the fourth iteration, its gradient passed on one side and not on the other, and every
    parameter below it moved by up to 6e-3 (relative) where they had agreed to 1e-7."""
    netp = with_synthetic_data(proto.parse_file(resolve_net("lenet", "train_test"), "NetParameter"), 512)
    for layer in netp.layer:
        if layer.type == "ReLU":
            layer.type = "TanH"
        if layer.type == "Pooling":
            layer.pooling_param.pool = "AVE"
    ip1 = next(layer for layer in netp.layer if layer.name == "ip1")
    ip1.param[0].lr_mult, ip1.param[0].decay_mult = lr_mult, decay_mult
    return netp


@pytest.mark.parametrize("rule", ["Nesterov", pytest.param("Adam", marks=pytest.mark.slow)])
def test_sfb_layers_follow_any_rule(rule):
    """Rules other than plain SGD rebuild the whole gradient and run the Solver's own update
    (plain SGD takes the fused tile path, checked above): both equal one process.  On the smooth
    LeNet (``smooth_lenet``): Adam divides each gradient by its running magnitude, so where a
    gradient is near zero the two runs' rounding becomes a visible step, and with ReLU's kinks
    conv2's weights differed by 2.9e-4 (relative) after three iterations; on the smooth net by
    at most 2.2e-5 (measured), Nesterov by ~1e-7."""
    fields = {"type": rule, "net_param": smooth_lenet()}
    fields |= {"base_lr": 0.001, "momentum2": 0.999} if rule == "Adam" else {}
    ref = lenet_solver(3, **fields)
    ref.step(3)
    want = [p.data.copy() for p in ref.net.learnable_params]
    solvers, nodes, pos = run(2, "sfb", True, **fields)
    assert not pos[0].fused_sgd
    for s in solvers:
        assert_matches(s, want)


@pytest.mark.parametrize(
    "policy",
    [
        {"lr_policy": "step", "stepsize": 1, "gamma": 0.5, "net_param": smooth_lenet()},
        {"lr_policy": "poly", "power": 2.0, "net_param": smooth_lenet()},
        {"weight_decay": 0.05, "net_param": smooth_lenet(3.0, 0.5)},
    ],
    ids=["step", "poly", "multipliers"],
)
def test_sfb_layers_follow_the_lr_policy(policy):
    """The SFB layers' update (the fused SGD path) takes each iteration's rate from the Solver's
    lr policy, as the shards do: a rate that halves every iteration (or falls to 0 by max_iter)
    gives the parameters of one process only if every clock uses its own rate; and the layer's
    own lr_mult and decay_mult (ip1's weight: x3 and x0.5, under a decay large enough to show).
    On a smooth LeNet (``smooth_lenet``: no kink for the two runs' rounding to fall on either side of)."""
    iters = 4
    ref = lenet_solver(iters, **policy)
    ref.step(iters)
    want = [p.data.copy() for p in ref.net.learnable_params]
    solvers, nodes, pos = run(2, "sfb", True, iters=iters, **policy)
    assert pos[0].fused_sgd
    for s in solvers:
        assert_matches(s, want)


def test_sfb_replicas_skip_their_own_weight_gradient():
    """The rebuilt gradient replaces an SFB layer's own: the replicas do not compute it, the
    plain SGD rule takes the fused path, and the update writes the node's parameters in place."""
    solvers, nodes, pos = run(2, "hybrid", False, iters=1)
    p = pos[0]
    assert p.fused_sgd
    (l,) = p.sfb
    assert p.replicas[0].layers[l].param_propagate_down == [False, False]
    ps_layer = p.replicas[0].layer_names.index("ip2")
    assert p.replicas[0].layers[ps_layer].param_propagate_down == [True, True]
    for i in p.sfb_blobs:
        assert np.shares_memory(p.sfb_net.learnable_params[i].flat_data, nodes[0].params(i))


def test_start_up_prints_the_plan_and_bytes_table():
    solvers, nodes, pos = run(2, "hybrid", True, iters=2)
    text = "\n".join(pos[0].logs)
    assert "HybComm plan (hybrid)" in text and "SFB" in text and "WFBP on" in text
    table = pos[0].bytes_table(2)
    assert "ip1" in table and "SFB" in table and "measured" in table


def test_ssp_with_wfbp_keeps_replicas_identical():
    solvers, nodes, pos = run(2, "hybrid", True, iters=4, staleness=1)
    for s in solvers:
        assert all(np.isfinite(p.data).all() for p in s.net.learnable_params)
    for i in pos[0].sfb_blobs:  # the last clock is exact (max_iter): every node waited for it
        assert np.array_equal(solvers[0].net.learnable_params[i].data, solvers[1].net.learnable_params[i].data)


class SlowParams(SocketTransport):
    """A slow shard: every PARAM frame leaves 30 ms late."""

    def send(self, dst, kind, key, clock, array=None, payload=None):
        if kind == F.PARAM:
            time.sleep(0.03)
        super().send(dst, kind, key, clock, array, payload)


@pytest.mark.parametrize("staleness", [0, 1])
def test_ssp_bounds_how_stale_a_forward_may_be(staleness):
    """With WFBP each layer's forward waits for its own parameters: at clock c, version c - s at
    least (s = --staleness; version v = after v updates), for PS layers (every shard's slice)
    and SFB layers (the node's own rebuild) alike. Behind a slow shard, SSP 1 does compute on
    the previous version where BSP waits."""
    seen = []  # (layer, clock, version) at node 1's forwards

    def setup(nodes, pos):
        node, p = nodes[1], pos[1]
        net = p.replicas[0]
        conv1, ip1 = net.layer_names.index("conv1"), net.layer_names.index("ip1")

        def before(l):
            if l == conv1:
                seen.append(("conv1", node.clock, int(node.versions[0].min())))
            elif l == ip1:
                seen.append(("ip1", node.clock, p.version[ip1]))

        net.add_hooks(before_forward=before)  # (after Poseidon's: its wait is over)

    run(2, "hybrid", True, iters=6, staleness=staleness, transport=SlowParams, setup=setup)
    assert {name for name, _, _ in seen} == {"conv1", "ip1"} and len(seen) == 12
    for name, c, v in seen:
        assert v >= c - staleness, f"{name} computed clock {c} with version {v} (staleness {staleness})"
    ahead = [c for name, c, v in seen if name == "conv1" and v < c]
    assert bool(ahead) == bool(staleness), seen


@pytest.mark.parametrize("wfbp", [True, False])
def test_snapshot_and_resume_keep_the_sfb_layers_history(tmp_path, wfbp):
    prefix = str(tmp_path / "run")
    run(2, "hybrid", wfbp, iters=2, snapshot=2, snapshot_prefix=prefix)
    solvers, _, pos = run(2, "hybrid", wfbp, iters=4, resume=prefix + "_iter_2.solverstate")
    assert pos[0].sfb and solvers[0].iter == 4
    want = reference(4)
    for s in solvers:  # BSP agrees to ~1e-7; dropping the momentum of the SFB layer shows at 1e-4
        assert_matches(s, want, tol=1e-5)


@pytest.mark.parametrize("wfbp", [True, False])
def test_iter_size_adds_up_batches_across_nodes(wfbp):
    """iter_size 2 over PS: each clock's gradient slot holds two batches' sum (the Solver may not
    skip clearing, and with WFBP it clears a slot no shard is still reading)."""
    ref = lenet_solver(3, iter_size=2)
    ref.step(3)
    want = [p.data.copy() for p in ref.net.learnable_params]
    solvers, nodes, pos = run(2, "ps", wfbp, iter_size=2)
    for s in solvers:
        assert_matches(s, want)


def test_the_solver_net_shows_the_node_gradient_and_skips_clearing():
    """With iter_size 1 the node's gradient source writes the diffs the Solver's net shows (this
    node's gradient of the clock), so the Solver does not clear them; the node zeroes only what
    the backward adds into: PS blobs, not an SFB layer's (its replicas never write them)."""
    seen = []

    class Watch:
        def on_start(self, solver):  # the diffs as the last clock left them: not cleared
            if solver.iter > 0:
                seen.append(("start", float(np.abs(solver.net.learnable_params[0].diff).sum())))

        def on_gradients_ready(self, solver):
            node = nodes_of[0]
            same = all(np.shares_memory(p.diff, node.grad(i)) for i, p in enumerate(solver.net.learnable_params))
            seen.append(("ready", same))

    nodes_of = []

    def setup(nodes, pos):
        nodes_of.append(nodes[0])
        nodes[0].solver.add_callback(Watch())

    solvers, nodes, pos = run(2, "hybrid", False, setup=setup)
    assert [v for k, v in seen if k == "ready"] == [True] * 3
    assert all(v > 0 for k, v in seen if k == "start") and len(seen) == 5
    node, p = nodes[0], pos[0]
    zeroed = {i for i in range(node.n_blobs) for lo, hi in node.zero_ranges if lo <= node.layout.offsets[i] < hi}
    assert zeroed == set(node.ps_blobs) and not zeroed & set(p.sfb_blobs)
    for i in p.sfb_blobs:  # never written, never cleared
        assert not node.grad(i).any()


def test_refusals():
    with pytest.raises(MinicaffeError, match="clip_gradients"):
        run(2, "hybrid", False, iters=1, clip_gradients=10.0)
    with pytest.raises(MinicaffeError, match="iter_size"):
        run(2, "sfb", False, iters=1, iter_size=2)
    with pytest.raises(MinicaffeError, match="--comm"):
        run(2, "allreduce", False, iters=1)
    assert "FACTOR" in F.KIND_NAMES.values()


@pytest.mark.parametrize("flags", [("--comm", "ps"), ("--wfbp", "on")])
def test_nodes_started_with_different_poseidon_flags_refuse_each_other(monkeypatch, flags):
    """Every node must plan the same way (the plan decides which frames travel): a node started
    with another --comm or --wfbp is refused when the nodes meet, naming the setting."""
    import argparse
    import socket

    from minicaffe.dist import launch
    from minicaffe.dist.transport import DistError

    monkeypatch.setenv("MINICAFFE_DIST_SECRET", "ab" * 32)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    base = ["--world-size", "2", "--rendezvous", f"127.0.0.1:{port}", "--connect-timeout", "20"]
    argv = [["--rank", "0", *base], ["--rank", "1", *base, *flags]]
    solver = lenet_solver(1)
    errors, formed = {}, {}

    def node(r):
        try:
            formed[r] = launch.make_transport(parser.parse_args(argv[r]), solver, log=lambda m: None)
        except DistError as exc:
            errors[r] = str(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for t in formed.values():
        t.shutdown()
    assert errors, "the nodes formed a cluster with different settings"
    text = " ".join(errors.values())
    assert "communication differs" in text and " ".join(flags) in text, errors


# -- the same algorithms over MPI ----------------------------------------------------------------
MPI_CHECK = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_dist_poseidon_runtime import lenet_solver, reference
from minicaffe.dist.launch import config_hashes
from minicaffe.dist.mpi import MPITransport
from minicaffe.dist.poseidon import Poseidon, frame_limit
from minicaffe.dist.ps import Node

solver = lenet_solver(3)
limit = max(max(p.count for p in solver.net.learnable_params) * 4, frame_limit(solver.net))
t = MPITransport(config_hashes(solver), limit, log=lambda m: None)
node = Node(solver, t, gradient_slots=2)
pos = Poseidon(node, "hybrid", True, log=lambda m: None)
node.attach_solver()
node.start()
solver.step(3)
node.finish()
want = reference(3)
err = max(float(np.abs(p.data - w).max() / np.abs(w).max()) for p, w in zip(solver.net.learnable_params, want))
np.save({out!r} + f"/ip1_{{t.rank}}.npy", solver.net.layer_dict["ip1"].blobs[0].data)
ratios = [m / (r + h) for (r, h), m in zip(pos.predicted_bytes().values(), pos.measured_bytes(3).values())]
print(f"rank {{t.rank}}: relative difference {{err:.3g}}, SFB layers {{sorted(s.name for s in pos.sfb.values())}}, "
      f"bytes measured / predicted {{min(ratios):.3f}}..{{max(ratios):.3f}}")
sys.exit(0 if err <= 1e-4 and all(abs(r - 1) <= 0.05 for r in ratios) else 3)
"""


@pytest.mark.slow
def test_hybrid_wfbp_over_mpi(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install 'minicaffe[mpi]')")
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("mpiexec not found next to the Python interpreter or on PATH")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "check.py"
    script.write_text(MPI_CHECK.format(tests=os.path.join(root, "tests"), out=str(tmp_path)))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SFB layers ['ip1']") == 2, r.stdout
    assert np.array_equal(np.load(tmp_path / "ip1_0.npy"), np.load(tmp_path / "ip1_1.npy"))  # replicas bitwise


def test_the_timeline_shows_the_overlap_wfbp_buys(tmp_path):
    """Node 0's per-layer timeline (compute and communication of each layer, what the benchmark
    plots): with WFBP off every layer's sync starts after the whole backward; with WFBP on, ip1's
    starts while the convolutions' backward is still running. The benchmark's plot draws both."""
    import importlib.util
    import os

    runs, node_reports = {}, {}
    for wfbp in (False, True):
        _, nodes, pos = run(2, "hybrid", wfbp, iters=5)
        runs[wfbp] = pos[0].report(5)["timeline"]
        node_reports[wfbp] = {str(n.rank): n.report() for n in nodes}
    for wfbp, ev in runs.items():
        clock = 3  # (recorded: clocks 2 to 4 of 5)
        backward = {name: (a, b) for lane, name, a, b, c in ev if lane == "backward" and c == clock}
        syncs = {name: (a, b) for lane, name, a, b, c in ev if lane == "sync" and c == clock}
        assert {"conv1", "conv2", "ip1", "ip2"} <= set(backward) and set(syncs) == {"conv1", "conv2", "ip1", "ip2"}
        assert all(a <= b for a, b in syncs.values())
        end_of_backward = max(b for _, b in backward.values())
        if wfbp:
            assert syncs["ip1"][0] < backward["conv1"][1], (syncs["ip1"], backward["conv1"])
        else:
            assert min(a for a, _ in syncs.values()) >= end_of_backward, (syncs, end_of_backward)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("poseidon_bench", os.path.join(root, "benchmarks", "poseidon.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = {
        "lenet|2|1gbit|hybrid|off": {"timeline": runs[False]},
        "lenet|2|1gbit|hybrid|on": {"timeline": runs[True]},
    }
    png = tmp_path / "timeline.png"
    assert bench.plot_timelines(results, ["lenet|2|1gbit|hybrid|off", "lenet|2|1gbit|hybrid|on"], str(png))
    assert png.stat().st_size > 10_000
    # the train tool's picture (every node's threads) draws the SFB layer's traffic and rebuild too
    for reports in node_reports.values():
        for rank, rep in reports.items():
            labels = {(lane, label) for lane, _a, _b, label in rep["timeline"]}
            for lane, label in [("send", "FACTOR ip1/w u"), ("recv", "FACTOR ip1/w v"), ("server", "rebuild ip1")]:
                assert (lane, label) in labels, (rank, lane, label)
            assert ("send", "GRAD ip2") in labels and ("recv", "PARAM conv1+conv2") in labels
            assert all(a <= b for _lane, a, b, _label in rep["timeline"])
    assert timeline.layer_of("FACTOR ip1/w u") == "ip1" and timeline.layer_of("rebuild ip1") == "ip1"
    path = timeline.plot_timeline(node_reports[True], str(tmp_path / "nodes.png"))
    assert os.path.getsize(path) > 10_000
    # the benchmark's per-node figure: a panel per run, every node's four lanes in it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = timeline.layer_colors(list(node_reports.values()))
    assert {"conv1", "conv2", "ip1", "ip2"} <= set(colors)
    fig, ax = plt.subplots()
    assert timeline.draw_nodes(ax, node_reports[True], colors) > 0
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == ["node 0 compute", "send", "recv", "server", "node 1 compute", "send", "recv", "server"]
    plt.close(fig)
    results = {k: {"node_timelines": node_reports[w]} for k, w in zip(results, (False, True))}
    png = tmp_path / "timeline_nodes.png"
    assert bench.plot_node_timelines(results, list(results), str(png)) and png.stat().st_size > 10_000
    assert not bench.plot_node_timelines({"lenet|2|1gbit|ps|off": {"timeline": []}}, ["lenet|2|1gbit|ps|off"], "x")
