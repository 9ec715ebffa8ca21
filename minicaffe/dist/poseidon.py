"""Poseidon's two ideas on top of a distributed node: wait-free backprop and hybrid communication.

``Poseidon(node, comm="hybrid", wfbp=True)`` joins a ``minicaffe.dist.ps.Node`` (before its
``start()``) through declared seams only: the replicas' ``Net.add_hooks``, the Solver's
callbacks, and the Node's extension point (``ps_blobs``, ``hooked_blobs``, ``extra_waits``,
``combined_by_hooks``, ``extra_handlers``).

**Hybrid communication** (``comm``): ``cost.plan`` picks, per layer, the parameter server (PS)
or sufficient-factor broadcasting (SFB). A PS layer's blobs go through the Node's shards as
before. An SFB layer never reaches the shards: after its backward, each node writes its factors
u (K x M, top diff, scaled by its share of the global batch) and v (K x N, bottom data) into
row block ``rank`` of two per-layer matrices U (sum K x M) and V (sum K x N) and sends that block
to every peer (FACTOR frames, key = 2 x weight blob + 0 for u / 1 for v, received straight into
the peer's U and V). When all P blocks are in, this node's SFB thread rebuilds the summed
gradient with one GEMM (U^T V; the bias: the column sums of U), applies the Solver's own rule
(a Solver of the same type over the SFB layers' parameters, as each PS shard has one), and
writes the new parameters into the node's parameter vector. Every node runs the same GEMM on
the same U and V in the same order and the same update on the same state, so the replicas stay
bitwise identical (tested).

**Wait-free backprop** (``wfbp``): what synchronizes on its own is a *unit* (an SFB layer, or a
gradient bucket of PS layers). The sync of a unit starts in the after-backward hook of its
lowest layer (PS: ``node.push``; SFB: the factors are sent), while the backward of the layers
below goes on; the next forward waits, in the before-forward hook of the first layer that
reads the unit's parameters, for that unit only (PS: ``node.wait_params``; SFB: this
runtime's version of the layer). Without WFBP the PS pushes happen in the Node's ``sync()``
and the SFB factors leave in ``on_gradients_ready``, after the whole backward, and ``sync()``
waits for every unit before the next iteration. A unit holding the lowest layer that
synchronizes can only start once the backward is done, WFBP or not (``cost.starts_in_backward``):
it is synchronized exactly as without WFBP, so WFBP costs nothing where it has nothing to
overlap (a plan of one unit runs the same schedule, the same frames, the same numbers).

With ``--workers N`` the hooks of the N replicas count: the last worker through layer l's
backward sums the workers' gradients of that layer (PS) or has the node's factor block complete
(SFB, each worker writes its own rows) and starts the sync.

Refused with a clear error: SFB layers with ``clip_gradients`` (the global norm would need every
layer's gradient before any update) or ``iter_size > 1``.
"""

import threading
import time

import numpy as np

from ..errors import MinicaffeError
from ..parallel.replica import shard_bounds
from ..solvers import solver_class
from . import cost
from . import frames as F
from .ps import ShardNet
from .sfb import SufficientFactors, rebuild, rebuild_sgd_step, tile_for
from .transport import DistError


def _quiet(_message):
    pass


def frame_limit(net):
    """The largest FACTOR frame a run of ``net`` can send: a node's whole batch of u or v rows of
    one InnerProduct layer (a transport refuses frames over its limit before reading them)."""
    out = 0
    for i, layer in enumerate(net.layers):
        if layer.type == "InnerProduct":
            top, bottom = net.top_vecs[i][0], net.bottom_vecs[i][0]
            out = max(out, top.count * net.dtype.itemsize, bottom.count * net.dtype.itemsize)
    return out


class SFBLayer:
    """One SFB layer's geometry and buffers: U, V per clock slot; rows of every node."""

    def __init__(self, index, name, blobs, m, n, transpose, rows, dtype, slots):
        self.index, self.name, self.blobs = index, name, blobs  # blobs: [weight] or [weight, bias]
        self.m, self.n, self.transpose = m, n, transpose
        self.rows = rows  # rows of each node, rank order
        self.starts = np.concatenate([[0], np.cumsum(rows)]).astype(int)
        total = int(self.starts[-1])
        self.U = [np.zeros((total, m), dtype) for _ in range(slots)]
        self.V = [np.zeros((total, n), dtype) for _ in range(slots)]

    def block(self, slot, rank, part):
        a = (self.U if part == 0 else self.V)[slot]
        return a[self.starts[rank] : self.starts[rank + 1]]


class Poseidon:
    """WFBP and HybComm for one node; see the module docstring."""

    def __init__(self, node, comm="hybrid", wfbp=True, log=None, costs=None):
        if comm not in cost.COMM_MODES:
            raise MinicaffeError(f"--comm must be one of {', '.join(cost.COMM_MODES)}, got '{comm}'")
        self.node, self.comm, self.wfbp = node, comm, bool(wfbp)
        self.log = log or node.log
        solver = node.solver
        self.solver = solver
        self.rank, self.world = node.rank, node.world
        self.replicas = [r for r, _ in node.replicas]
        rep = self.replicas[0]
        # the plan (cost.plan: Poseidon's byte rule, kept where SFB pays in the run's own costs);
        # the launcher passes the one it decided --wfbp auto with
        if costs is None:
            costs = cost.plan(rep, self.world, comm=comm, workers=node.n_workers, bucket_bytes=node.bucket_bytes)
        self.costs = costs
        self.blob_layer = {}  # learnable blob index -> layer index (the layer that owns it)
        for i, l in enumerate(rep.param_layer_indices):
            self.blob_layer[i] = l
        self.layer_blobs = {c.index: list(c.params) for c in self.costs}  # what each layer syncs
        self.reads = {}  # layer -> every learnable blob its forward reads (shared ones too)
        for l, entries in cost.layer_params(rep).items():
            self.reads[l] = [i for i, _ in entries]
        chosen = [c for c in self.costs if c.choice == "sfb"] if self.world > 1 else []
        p = solver.param
        if chosen and p.clip_gradients >= 0:
            raise MinicaffeError(
                f"clip_gradients needs the global gradient norm before any update, but SFB layers "
                f"({', '.join(c.name for c in chosen)}) update on their own: use --comm ps"
            )
        if chosen and p.iter_size > 1:
            raise MinicaffeError(
                f"iter_size {p.iter_size} with SFB layers ({', '.join(c.name for c in chosen)}) is not "
                f"supported: use --comm ps, or a larger batch"
            )
        # -- SFB layers: rows per node, buffers, and a Solver over their parameters
        # clock slots of U and V: under SSP a peer may send factors up to 2s + 1 clocks ahead of
        # this node's version of the layer (it needs ours of clock c - s - 1 to compute clock c)
        self.slots = 2 * node.staleness + 2
        first = node.data_layers[0][1]
        node_rows = [hi - lo for lo, hi in shard_bounds(first.batch_size, self.world)]
        self.sfb = {}
        rep_items = node.worker_bounds[first.name][0][1] - node.worker_bounds[first.name][0][0]
        for c in chosen:
            per_item = rep.top_vecs[c.index][0].count // c.m // rep_items  # rows per image (axis > 1: more)
            rows = [r * per_item for r in node_rows]
            self.sfb[c.index] = SFBLayer(c.index, c.name, c.params, c.m, c.n, c.transpose, rows, rep.dtype, self.slots)
        self.sfb_blobs = sorted(i for s in self.sfb.values() for i in s.blobs)
        # rows of each worker inside this node's block (the same split as the batch)
        self.worker_rows = {}
        for l, s in self.sfb.items():
            per_item = s.rows[self.rank] // max(node_rows[self.rank], 1)
            bounds = node.worker_bounds[first.name]
            base = bounds[0][0]
            self.worker_rows[l] = [((a - base) * per_item, (b - base) * per_item) for a, b in bounds]
        sizes = [node.layout.counts[i] if i in self.sfb_blobs else 0 for i in range(node.n_blobs)]
        self.sfb_net = ShardNet(solver.net, sizes)
        for i in self.sfb_blobs:  # the update writes the node's parameter vector itself: no copy
            blob = self.sfb_net.learnable_params[i]
            blob.attach(node.params(i), blob.flat_diff)
        # An SFB layer's own weight gradient is never used (every node rebuilds the summed one
        # from the factors): the replicas skip computing it (Caffe's param_propagate_down), which
        # saves a GEMM and an M x N write per layer per iteration on every node.
        for rep_net in self.replicas:
            for l in self.sfb:
                layer = rep_net.layers[l]
                layer.param_propagate_down = [False] * len(layer.param_propagate_down)
        sp = p.copy()
        for f in ("test_iter", "test_net", "test_net_param", "test_state"):
            sp.clear(f)
        sp.random_seed = -1
        sp.clip_gradients = -1
        self.sfb_solver = solver_class(solver.type)(sp, train_net=self.sfb_net, log=_quiet)
        # plain SGD with L2 decay: the rebuild and the update in one pass over row tiles
        # (``_step_sgd``); any other rule rebuilds the whole gradient, then runs the Solver's own
        self.fused_sgd = solver.type == "SGD" and sp.regularization_type == "L2"
        self.tiles = {}  # layer -> a tile of rebuilt gradient rows (fits in the cache)
        self.version = {l: 0 for l in self.sfb}  # clocks applied to each SFB layer
        self.arrivals = {}  # (clock, layer) -> blocks here (own block counts one)
        self.ready = []  # (clock, layer) with every block here
        self.worker_done = {}  # (clock, layer) -> workers through the layer's backward
        self.started = False
        self.closed = False
        self.sfb_wait = 0.0
        self.timeline = []  # (lane, layer, start, end, clock) over clocks iter0 + [2, 12)
        self.timeline_window = (2, 12)  # past clock 0 (numba compiles) and clock 1
        self._watch = []  # (clock, layer, started): PS syncs whose end the watcher records
        self.lock = threading.Lock()
        # the SFB thread's own condition (on the Node's lock): woken when a layer's factors are
        # all here, not by every frame the node receives
        self.work = threading.Condition(node.lock)
        node.wake_on_error.append(self.work)
        # -- join the Node, the replicas and the Solver
        node.ps_blobs = [i for i in range(node.n_blobs) if i not in self.sfb_blobs]
        node.plan_shards()  # the gradient buckets over the PS blobs only
        self._plan_wfbp(node)
        node.combined_by_hooks = node.n_workers > 1 and bool(self.early)
        node.extra_waits.append(self._wait_in_sync)
        node.extra_handlers[F.FACTOR] = self
        node.extra_handlers[F.SFB_HIST] = self
        self.hist_pending = None  # on resume: SFB history frames still to come from node 0
        self.handles = []
        for k, net in enumerate(self.replicas):
            self.handles.append(
                net.add_hooks(
                    before_forward=lambda l, k=k: self._before_forward(k, l),
                    after_forward=lambda l, k=k: self._after_forward(k, l),
                    before_backward=lambda l, k=k: self._before_backward(k, l),
                    after_backward=lambda l, k=k: self._after_backward(k, l),
                )
            )
        solver.add_callback(self)
        self.thread = threading.Thread(target=self._serve, name="minicaffe-sfb", daemon=True)
        self._t_forward = self._t_backward = self._t_ready = 0.0
        self._sync_t0 = {}  # (clock, layer) -> when its sync started (timeline clocks only)
        self.iter0 = None
        if self.rank == 0:
            self.log(cost.format_plan(self.costs, self.world, comm=comm))
            units = len(self.units())
            inside = f": {self.early_units} of {units} unit(s) sync inside the backward" if self.wfbp else ""
            self.log(
                f"WFBP {'on' if self.wfbp else 'off'}{inside}; {len(self.sfb)} SFB layer(s), "
                f"{len(node.ps_blobs)} PS blob(s)"
            )
            if node.ps_blobs:
                self.log(node.bucket_plan())

    def _plan_wfbp(self, node):
        """Which units sync inside the backward (``cost.starts_in_backward``: all but those holding
        the lowest layer), and where the next forward waits for each: ``early`` (layers whose
        after-backward hook starts their unit's sync), ``node.hooked_blobs`` (the PS blobs those
        hooks push), ``wait_at`` (layer -> the PS blobs and SFB layers its before-forward hook
        waits for: every early unit at the first layer that reads it), ``late`` (the layers
        synchronized after the backward, as without WFBP)."""
        units = [([l], None, l) for l in self.sfb]  # (layers, PS blobs, SFB layer)
        for blobs in node.buckets.values():
            units.append((sorted({self.blob_layer[i] for i in blobs}), blobs, None))
        first_reader = {}
        for l in sorted(self.reads):
            for i in self.reads[l]:
                first_reader.setdefault(i, l)
        self.early, self.wait_at, hooked = set(), {}, set()
        inside = cost.starts_in_backward([layers for layers, _, _ in units]) if self.wfbp else [False] * len(units)
        for (layers, blobs, sfb_layer), early in zip(units, inside):
            if not early:
                continue
            self.early.update(layers)
            mine = blobs if blobs is not None else self.sfb[sfb_layer].blobs
            at = min(first_reader.get(i, self.blob_layer[i]) for i in mine)
            ps_waits, sfb_waits = self.wait_at.setdefault(at, ([], []))
            if blobs is not None:
                hooked.update(blobs)
                ps_waits.extend(blobs)
            else:
                sfb_waits.append(sfb_layer)
        self.early_units = sum(inside)
        self.late = sorted((l for l in self.layer_blobs if l not in self.early), reverse=True)
        node.hooked_blobs = hooked
        needed = node.staleness + 2 if self.early else 1
        if node.n_slots < needed:
            raise MinicaffeError(
                f"WFBP syncs {self.early_units} unit(s) inside the backward: the Node needs "
                f"gradient_slots={needed} (cost.wfbp_gradient_slots), it has {node.n_slots}"
            )

    # -- Solver callbacks ----------------------------------------------------------------------
    def on_start(self, solver):
        if self.started and self.recording(solver.iter):  # iteration boundaries, for the timeline
            with self.lock:
                self.timeline.append(("iteration", "", self._now(), self._now(), solver.iter))
        if not self.started:  # the Node has started: W holds the run's initial parameters
            self.started = True
            self._resume_history(solver)
            self.sfb_solver.iter = solver.iter
            self.sfb_solver.current_step = solver.current_step
            self.version = {l: solver.iter for l in self.sfb}
            self.iter0 = solver.iter
            self.thread.start()
            if self.layer_blobs and len(self.sfb) < len(self.layer_blobs):
                threading.Thread(target=self._watcher, name="minicaffe-sync-watch", daemon=True).start()

    def _resume_history(self, solver):
        """A resumed run: node 0 restored the Solver's history; every node needs the SFB layers'."""
        node, n = self.node, self.node.n_blobs
        if self.rank == 0:
            if not node.resume or not self.sfb_blobs:
                return
            for h, hist in enumerate(self.sfb_solver.history):
                for i in self.sfb_blobs:
                    hist[i][...] = solver.history[h][i].reshape(-1)
                    for dst in range(1, self.world):
                        node.transport.send(dst, F.SFB_HIST, h * n + i, solver.iter, hist[i])
            return
        state = (node.init_pending or {}).get("state") or {}
        if not state.get("resume") or not self.sfb_blobs:
            return
        want = len(self.sfb_solver.history) * len(self.sfb_blobs)
        with node.cv:
            while node.error is None and (self.hist_pending or 0) < want:
                node.cv.wait(0.5)
            if node.error is not None:
                raise DistError(f"node {self.rank}: {node.error} (waiting for the SFB layers' history)")

    def on_gradients_ready(self, solver):
        self._t_ready = self._now()
        for l in self.late:  # the whole backward is done: their syncs start now, top layer first
            if l in self.sfb:
                self._send_factors(l, self.node.clock)
            else:  # (the Node's sync() pushes these right after)
                self._sync_started(l, self.node.clock, self._t_ready)

    def on_iteration(self, solver, loss, lr):
        if self.late and self.recording(solver.iter - 1):  # the node waited in sync() for these
            what = (
                "(all layers)"
                if not self.early
                else "(" + ", ".join(self.replicas[0].layer_names[l] for l in self.late) + ")"
            )
            with self.lock:
                self.timeline.append(("wait", what, self._t_ready, self._now(), solver.iter - 1))
        p = solver.param
        due = (p.snapshot and solver.iter % p.snapshot == 0) or solver.iter >= p.max_iter or solver.requested_stop
        if self.rank == 0 and due and self.sfb:
            self.wait_all(solver.iter)  # the snapshot must see SFB layers' history too
            for h, hist in enumerate(self.sfb_solver.history):
                for i in self.sfb_blobs:
                    solver.history[h][i][...] = hist[i].reshape(solver.history[h][i].shape)

    # -- hooks (compute threads) ---------------------------------------------------------------
    def _now(self):
        return time.perf_counter() - self.node.t_origin

    def recording(self, clock):
        return self.started and self.timeline_window[0] <= clock - self.iter0 < self.timeline_window[1]

    def _record(self, lane, l, start, end):
        clock = self.node.clock
        if self.recording(clock):
            with self.lock:
                self.timeline.append((lane, self.replicas[0].layer_names[l], start, end, clock))

    def _before_forward(self, k, l):
        waits = self.wait_at.get(l)
        if waits is not None:  # the first layer that reads an early unit: its fresh parameters
            t0 = self._now()
            version = self.node.clock - self.node.staleness
            for i in waits[0]:
                self.node.wait_params(i, version)
            for s in waits[1]:
                self._wait_layer(s, version)
            if k == 0 and self._now() - t0 > 1e-4:
                self._record("wait", l, t0, self._now())
        if k == 0:
            self._t_forward = self._now()

    def _after_forward(self, k, l):
        if k == 0:
            self._record("forward", l, self._t_forward, self._now())

    def _before_backward(self, k, l):
        if k == 0:
            self._t_backward = self._now()

    def _after_backward(self, k, l):
        if k == 0:
            self._record("backward", l, self._t_backward, self._now())
        if l not in self.layer_blobs:
            return
        node, clock = self.node, self.node.clock
        if node.calls % node.iter_size:  # iter_size > 1 (PS only): the sum is final after the last batch
            return
        if l in self.sfb:
            s = self.sfb[l]
            slot = clock % self.slots
            rep = self.replicas[k]
            a, b = self.worker_rows[l][k]
            u = s.block(slot, self.rank, 0)[a:b]
            v = s.block(slot, self.rank, 1)[a:b]
            u[...] = rep.top_vecs[l][0].diff.reshape(b - a, s.m)
            u *= node.worker_weights[k]  # this worker's share of the global mean gradient
            v[...] = rep.bottom_vecs[l][0].data.reshape(b - a, s.n)
        if l not in self.early:  # synchronized after the backward (on_gradients_ready, sync())
            return
        if node.n_workers > 1:
            with self.lock:
                key = (clock, l)
                n = self.worker_done.get(key, 0) + 1
                self.worker_done[key] = n
                if n < node.n_workers:
                    return
                del self.worker_done[key]
        if l in self.sfb:
            self._send_factors(l, clock)
        else:
            if node.combined_by_hooks:  # sum the workers' gradients of this layer into the node's
                G = node.G[clock % node.n_slots]
                for i in self.layer_blobs[l]:
                    lo, n = node.layout.offsets[i], node.layout.counts[i]
                    w = np.array(node.worker_weights, node.dtype) / node.scale
                    G[lo : lo + n] += w @ node.Gk[:, lo : lo + n]
            t0 = self._now()
            for i in self.layer_blobs[l]:
                node.push(i, clock)
            self._sync_started(l, clock, t0)

    def _sync_started(self, l, clock, t0):
        if self.recording(clock):
            with self.lock:
                if l in self.sfb:  # the SFB thread records its end
                    self._sync_t0[(clock, l)] = t0
                else:  # the watcher records when the last PARAM slice has landed
                    with self.node.cv:
                        self._watch.append((clock, l, t0))
                        self.node.cv.notify_all()

    def _watcher(self):
        """Timeline only: the end of each PS sync in the recorded clocks (all slices at clock + 1)."""
        node, end = self.node, self.iter0 + self.timeline_window[1]
        name = self.replicas[0].layer_names
        with node.cv:
            while not self.closed and node.error is None:
                for item in list(self._watch):
                    clock, l, t0 = item
                    if all(node.fresh[i] >= clock + 1 for i in self.layer_blobs[l]):
                        self._watch.remove(item)
                        self.timeline.append(("sync", name[l], t0, self._now(), clock))
                if not self._watch and node.clock >= end:
                    return
                node.cv.wait(0.2)

    # -- SFB: sending, receiving, rebuilding ---------------------------------------------------
    def _send_factors(self, l, clock):
        s = self.sfb[l]
        slot = clock % self.slots
        w = s.blobs[0]
        self._sync_started(l, clock, self._now())
        for dst in range(self.world):
            if dst != self.rank:
                self.node.transport.send(dst, F.FACTOR, 2 * w, clock, s.block(slot, self.rank, 0))
                self.node.transport.send(dst, F.FACTOR, 2 * w + 1, clock, s.block(slot, self.rank, 1))
        self._count(clock, l)

    def destination(self, src, h):
        if h.kind == F.SFB_HIST:
            hist, i = divmod(h.key, self.node.n_blobs)
            if src != 0 or self.rank == 0 or i not in self.sfb_blobs or hist >= len(self.sfb_solver.history):
                raise F.FrameError(f"SFB_HIST key {h.key} from node {src} is not an SFB layer's history")
            return self.sfb_solver.history[hist][i]
        w, part = divmod(h.key, 2)
        l = self.blob_layer.get(w)
        if l not in self.sfb or self.sfb[l].blobs[0] != w:
            raise F.FrameError(f"FACTOR frame for blob {w}, which is not the weight of an SFB layer", f"node {src}")
        with self.node.cv:
            v = self.version[l]
        if self.started and not v <= h.clock < v + self.slots - 1 + 1:
            raise F.FrameError(f"factors of clock {h.clock} while layer {self.sfb[l].name} is at version {v}")
        return self.sfb[l].block(h.clock % self.slots, src, part)

    def arrived(self, src, h, array):
        if h.kind == F.SFB_HIST:
            with self.node.cv:
                self.hist_pending = (self.hist_pending or 0) + 1
                self.node.cv.notify_all()
            return
        if h.key % 2 == 1:  # u and v of a node travel in order: v completes its block
            self._count(h.clock, self.blob_layer[h.key // 2])

    def key_name(self, kind, key):
        """'fc6/w u' / 'fc6/w v': the blob and the factor a FACTOR frame's key names."""
        if kind == F.SFB_HIST:
            return f"{self.node.blob_names[key % self.node.n_blobs]} history"
        return f"{self.node.blob_names[key // 2]} {'uv'[key % 2]}"

    def control(self, src, h, payload):
        raise F.FrameError("FACTOR frames carry tensors, not control payloads", f"node {src}")

    def _count(self, clock, l):
        with self.node.cv:
            key = (clock, l)
            n = self.arrivals.get(key, 0) + 1
            self.arrivals[key] = n
            if n == self.world:
                del self.arrivals[key]
                self.ready.append(key)
                self.work.notify()

    def _serve(self):
        """This node's SFB thread: rebuild and update each (clock, layer) whose blocks are all here."""
        node = self.node
        try:
            while True:
                with node.cv:
                    while not self.ready and not self.closed and node.error is None:
                        self.work.wait(0.5)
                    if self.closed or node.error is not None:
                        return
                    work = sorted(self.ready)
                    self.ready.clear()
                for clock, l in work:
                    self._apply(clock, l)
        except Exception as exc:  # noqa: BLE001  (stops the run with the reason)
            node.failed(f"the SFB thread on node {self.rank} failed: {type(exc).__name__}: {exc}")

    def _apply(self, clock, l):
        t0, c0 = time.perf_counter(), time.thread_time()
        self._rebuild_and_update(clock, l)
        t1 = time.perf_counter()
        with self.node.cv:
            busy = self.node.busy.setdefault("sfb", [0.0, 0.0])
            busy[0] += t1 - t0
            busy[1] += time.thread_time() - c0
            if self.node.recording(clock):  # the node's timeline picture: the server lane
                origin = self.node.t_origin
                self.node.timeline.append(("server", t0 - origin, t1 - origin, f"rebuild {self.sfb[l].name}"))

    def _rebuild_and_update(self, clock, l):
        s = self.sfb[l]
        slot = clock % self.slots
        ss, net = self.sfb_solver, self.sfb_net
        if ss.iter != clock or not hasattr(self, "_rate"):
            ss.iter = clock
            self._rate = ss.learning_rate()
        bias = net.learnable_params[s.blobs[1]].flat_diff if len(s.blobs) > 1 else None
        if self.fused_sgd:
            self._step_sgd(s, slot, self._rate)
            if bias is not None:
                bias[...] = s.U[slot].sum(axis=0)
                ss.update_parameter(s.blobs[1], self._rate)
        else:
            w = net.learnable_params[s.blobs[0]]
            wshape = (s.n, s.m) if s.transpose else (s.m, s.n)
            rebuild(
                SufficientFactors(s.U[slot], s.V[slot]),
                w.flat_diff.reshape(wshape),
                bias,
                transpose=s.transpose,
                gemm=self.solver.net.backend.gemm,
            )
            for i in s.blobs:
                ss.update_parameter(i, self._rate)
        with self.node.cv:  # (the parameters were updated in place, in the node's vector)
            self.version[l] = clock + 1
            self.node.cv.notify_all()
        with self.lock:
            t0 = self._sync_t0.pop((clock, l), None)
        if t0 is not None:
            with self.lock:
                self.timeline.append(("sync", s.name, t0, self._now(), clock))

    def _step_sgd(self, s, slot, rate):
        """SGD's fused step on the rebuilt gradient, a tile of rows at a time (sfb.rebuild_sgd_step:
        the M x N gradient is never written to memory). Equal to rebuild() + the Solver's
        SGDSolver.update_parameter (iter_size is 1 with SFB)."""
        a, b = (s.V[slot], s.U[slot]) if s.transpose else (s.U[slot], s.V[slot])
        tile = self.tiles.get(s.index)
        if tile is None:
            tile = self.tiles[s.index] = tile_for(a.shape[1], b.shape[1], a.dtype)
        i = s.blobs[0]
        ss, net, be = self.sfb_solver, self.sfb_net, self.solver.net.backend
        rebuild_sgd_step(
            a,
            b,
            net.learnable_params[i].flat_data,
            ss.history[0][i].reshape(-1),
            ss.param.momentum,
            rate * net.params_lr[i],
            ss.param.weight_decay * net.params_weight_decay[i],
            be.gemm,
            be.sgd_step,
            tile,
        )

    def _wait_layer(self, l, version):
        if self.version[l] >= version and self.node.error is None:  # (an int that only grows)
            return
        t0 = time.perf_counter()
        node = self.node
        with node.cv:
            while node.error is None and self.version[l] < version:
                node.cv.wait(0.5)
            if node.error is not None:
                raise DistError(f"node {self.rank}: {node.error} (at iteration {self.solver.iter})")
        self.sfb_wait += time.perf_counter() - t0

    def wait_all(self, version):
        """Every SFB layer at ``version`` at least."""
        for l in self.sfb:
            self._wait_layer(l, version)

    def _wait_in_sync(self, version, every):
        """The Node's ``sync()`` calls this where it waits: the SFB layers synchronized after the
        backward, or ``every`` one (the run needs every parameter: a test, a snapshot, the end)."""
        for l in self.sfb:
            if every or l not in self.early:
                self._wait_layer(l, version)

    # -- reports -------------------------------------------------------------------------------
    def units(self):
        """What synchronizes on its own, in layer order: (name, 'SFB', layer) for an SFB layer,
        (name, 'PS', bucket key) for a bucket of PS blobs (one blob, or whole layers)."""
        node, out = self.node, []
        for c in self.costs:
            if c.index in self.sfb:
                out.append((c.index, c.name, "SFB", c.index))
        for b, blobs in node.buckets.items():
            out.append((self.blob_layer[blobs[0]], node.bucket_name(b), "PS", b))
        return [(name, method, key) for _, name, method, key in sorted(out, key=lambda u: (u[0], u[3]))]

    def measured_bytes(self, iterations):
        """{unit name: bytes sent + received per iteration} from the transport's counters
        (payload + the 48-byte header of every frame); units as ``units()``."""
        st = self.node.transport.stats
        out = {}
        for name, method, key in self.units():
            if method == "SFB":
                w = self.sfb[key].blobs[0]
                keys = [("FACTOR", 2 * w), ("FACTOR", 2 * w + 1)]
            else:
                keys = [("GRAD", key), ("PARAM", key)]
            with st.lock:
                n = sum(st.sent.get(k, 0) + st.received.get(k, 0) for k in keys)
            out[name] = n / max(iterations, 1)
        return out

    def predicted_bytes(self):
        """{unit name: (rule bytes, header bytes)} per iteration for this node.

        The rule: an SFB layer's factors (SFB = 2K(P1-1)(M+N) floats, with this run's uneven K);
        a PS bucket's n floats, PS = 2n(P1+P2-2)/P2 summed over its layers. Headers: an SFB
        layer sends and receives a u and a v frame per peer (4 (P-1)); a PS bucket a GRAD and a
        PARAM frame per peer each way (4 (P-1), fewer where a tiny bucket leaves a shard empty).
        Bucketing changes the headers only."""
        out, node, P = {}, self.node, self.world
        cost_of = {c.index: c for c in self.costs}
        for name, method, key in self.units():
            if method == "SFB":
                s = self.sfb[key]
                mine = s.rows[self.rank]
                others = sum(s.rows) - mine
                floats = (mine * (P - 1) + others) * (s.m + s.n)
                out[name] = (floats * cost_of[key].itemsize, 4 * (P - 1) * F.HEADER_SIZE)
            else:
                bounds = node.bucket_bounds[key]
                n = bounds[-1][1] - bounds[0][0]
                mine = bounds[self.rank][1] - bounds[self.rank][0]
                floats = 2 * (n - mine) + 2 * (P - 1) * mine  # push + pull; as a shard: receive + answer
                others = sum(1 for s, (lo, hi) in enumerate(bounds) if s != self.rank and hi > lo)
                frames = 2 * others + (2 * (P - 1) if mine else 0)
                out[name] = (floats * node.dtype.itemsize, frames * F.HEADER_SIZE)
        return out

    def bytes_table(self, iterations):
        measured = self.measured_bytes(iterations)
        lines = [
            f"bytes per iteration on node {self.rank} ({self.comm}, WFBP {'on' if self.wfbp else 'off'}):",
            f"  {'layers':<16} {'method':<6} {'predicted':>12} {'+ headers':>10} {'measured':>12} {'ratio':>7}",
        ]
        methods = {name: method for name, method, _ in self.units()}
        for name, (rule, head) in self.predicted_bytes().items():
            method = methods[name]
            m = measured[name]
            lines.append(
                f"  {name:<16} {method:<6} {rule:>12,.0f} {head:>10,} {m:>12,.0f} {m / max(rule + head, 1):>7.3f}"
            )
        return "\n".join(lines)

    def report(self, iterations):
        """For train_log.json: per layer the method, predicted and measured bytes per iteration."""
        measured = self.measured_bytes(iterations)
        methods = {name: method.lower() for name, method, _ in self.units()}
        return {
            "comm": self.comm,
            "wfbp": self.wfbp,
            "syncs_in_backward": self.early_units,  # units WFBP starts inside the backward
            "bucket_bytes": self.node.bucket_bytes,
            "sfb_wait_s": self.sfb_wait,
            "layers": {
                name: {
                    "method": methods[name],
                    "predicted_bytes": rule,
                    "header_bytes": head,
                    "measured_bytes": measured[name],
                }
                for name, (rule, head) in self.predicted_bytes().items()
            },
            "timeline": self.timeline[:4000],
        }

    def close(self):
        with self.node.cv:
            self.closed = True
            self.node.cv.notify_all()
            self.work.notify_all()
        for h in self.handles:
            h.remove()
        self.handles = []
        self.solver.remove_callback(self)
