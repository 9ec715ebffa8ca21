"""The sharded parameter server: every node is a worker *and* one shard of the server
(Poseidon's distributed key-value store, co-located with the workers).

Sharding: the learnable blobs are grouped into **gradient buckets** (``plan_buckets``: whole
consecutive layers, from the last layer back, until a bucket holds ``bucket_bytes``, as PyTorch
DDP's ``bucket_cap_mb``; 0 = every blob alone), and every bucket is cut into P contiguous slices
(``shard_bounds(count, P)``, sizes differing by at most one); node s owns slice s of *every*
bucket.  Whole buckets per shard would be simpler, but one blob often dominates (LeNet's ip1
holds 400,000 of 431,080 parameters, AlexNet's fc6 38M of 61M): its shard would carry almost
all the traffic and all the update work.  With 1/P of each bucket every node sends and receives
the same bytes, and a bucket's sync is spread over all links at once.  A bucket is one range of
the flat vectors, so each of its frames is sent from, and received into, the node's own G and W
without a copy; the price of slicing is P - 1 messages per bucket per direction, and buckets
keep those few (LeNet: 2 buckets where there are 8 blobs, most of them tiny biases).

Every clock c (one global batch of B images; node r computes on its slice b_r of it)::

    node r (compute thread)                              shard s (its server thread)
      G = gradient of its b_r images, scaled by b_r / B
      for each bucket b (last layer first): push  ---- GRAD(b, c): slice s of bucket b of G ->
                                                           sum the P slices in rank order
                                                           the Solver's own update on slice s:
                                                           lr policy(c), normalize, decay, rule
      wait_params(i, c + 1 - staleness) <------------ PARAM(b, version c+1): slice s of b in W
      (received straight into the node's parameter vector W)

So the update rule, the lr policy, momentum, weight decay and every history buffer are those of
minicaffe's Solver (a Solver of the same type runs each shard: ``update_parameter`` over a net
whose blobs are the shard's slices).  BSP (staleness 0): a node starts clock c+1 only with every
slice at version c+1, so P nodes compute exactly what one process computes on the global batch
(up to float32 summation order).  SSP (staleness s): a node may start clock c+1 with slices as
old as version c+1-s; shards still apply every clock's update in order from all P gradients.

``clip_gradients`` needs the global norm of the summed gradient: each shard sends the sum of
squares of its slices (a NORM frame) to every other shard, and all scale by the same factor.

Extension point (wait-free backpropagation, hybrid communication): the Node is built so that a
layer can be synchronized on its own:

    ``node.push(i, clock)``          "blob i's gradients are final" (non-blocking: once every
                                     blob of its bucket is, the bucket's frames are queued to the
                                     communication threads); call it from the Net's
                                     after-backward hook of the layer owning blob i.
    ``node.wait_params(i, version)`` "wait for blob i's fresh parameters" (blocks until every
                                     slice has that version); call it from the before-forward hook.
    ``node.blob_names[i]``, ``node.grad(i)`` (this node's gradient of blob i, already scaled),
    ``node.params(i)`` (the parameter array every slice lands in), ``node.transport`` (send your
    own frames: kinds and keys in frames.py; ``node.extra_handlers[kind]`` receives them and
    names their keys with ``key_name(kind, key)``).

    What Poseidon's runtime (``minicaffe.dist.poseidon``) sets: ``Node(..., gradient_slots=s + 2)``
    for wait-free backprop where some bucket syncs inside the backward, and before ``start()``:
    ``node.ps_blobs`` (the blobs the shards serve; SFB layers synchronize themselves; then
    ``node.plan_shards()`` plans the buckets over them, ``node.bucket_plan()`` prints them),
    ``node.hooked_blobs`` (the blobs the after-backward hooks push and the before-forward hooks
    wait for: ``sync()`` pushes the others, and waits only for them except where the run needs
    every parameter: tests, snapshots, the end), ``node.extra_waits`` (callables of a version
    and ``every``, the run needs every parameter, that ``sync()`` calls where it waits) and
    ``node.combined_by_hooks`` (with several workers, the hooks sum each hooked layer's worker
    gradients into the node's gradient as soon as every worker has it; the Node sums the rest
    after the backward).

The default schedule (``sync()``, what the Solver's updater calls) pushes every blob, last
layer first, then waits for all of them.

Snapshots and resume: rank 0 owns the run's files.  At start-up it broadcasts the parameters, the
iteration, the lr step and the data readers' positions (INIT, STATE), and on resume the history
slices to their shards (HIST); before a snapshot it asks every shard for its history (HIST_REQ)
and writes the Solver's usual snapshot, which another run (or one process) can resume.
"""

import gc
import resource
import threading
import time

import numpy as np

from ..layers.data_base import DataLayer
from ..memory.flat import ParamLayout
from ..parallel.replica import build_replica, shard_bounds
from ..solvers import solver_class
from . import frames as F
from .cost import DEFAULT_BUCKET_BYTES, plan_buckets  # noqa: F401  (planned with the cost rule)
from .transport import DistError


class ShardNet:
    """The part of a Net a Solver's update touches, over this shard's slices of every blob."""

    def __init__(self, net, sizes):
        from ..blob import Blob

        self.name = net.name
        self.xp, self.backend, self.dtype = net.xp, net.backend, net.dtype
        self.learnable_params = [Blob((n,), net.dtype, net.xp, name=f"shard{i}") for i, n in enumerate(sizes)]
        self.params_lr = list(net.params_lr)
        self.params_weight_decay = list(net.params_weight_decay)
        self.layers, self.outputs, self.blobs = [], [], {}

    def clear_param_diffs(self):
        for p in self.learnable_params:
            p.flat_diff[...] = 0


def _quiet(_message):
    pass


class GcClock:
    """CPU seconds spent in Python's cyclic garbage collector while started (``gc.callbacks``:
    every collection of the process, timed on the thread that triggered it; nodes in threads
    share them).  A full (generation 2) pass walks every object of the process: some 100,000
    after numba has compiled, ~50 ms; ``launch.FreezeHeap`` keeps those out of its walk."""

    def __init__(self):
        self.seconds, self.passes, self._t0 = 0.0, [0, 0, 0], None

    def __call__(self, phase, info):
        if phase == "start":
            self._t0 = time.thread_time()
        elif self._t0 is not None:
            self.seconds += time.thread_time() - self._t0
            self.passes[info["generation"]] += 1
            self._t0 = None

    def start(self):
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self):
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def point_diffs(layout, flat):
    """Make ``flat`` the gradients' storage of ``layout``'s net, as it is (no zeroing: the
    caller zeroes what the backward accumulates into)."""
    for b, i in layout.blob_slots:
        b.attach(b.data_storage, layout.slice(flat, i))


def blob_names(net):
    """A name per learnable blob: 'conv1/w', 'conv1/b', ..."""
    names, k, owner_index = [], 0, 0
    for layer in net.layers:
        for j, _ in enumerate(layer.blobs):
            if net.params_owner[k] is None:
                names.append(f"{layer.name}/{'wb'[j] if j < 2 else j}")
                owner_index += 1
            k += 1
    return names


def blob_layers(net):
    """The layer index that owns each learnable blob (in ``net.learnable_params`` order)."""
    out, k = [], 0
    for l, layer in enumerate(net.layers):
        for _ in layer.blobs:
            if net.params_owner[k] is None:
                out.append(l)
            k += 1
    return out


def frame_bound(net, bucket_bytes=None):
    """The largest GRAD or PARAM payload a run of ``net`` can send (what a receiver refuses
    beyond): a bucket closes at the first layer boundary past its cap, so it is smaller than
    the cap plus the largest layer's blobs, and never more than the whole net."""
    cap = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    item = net.dtype.itemsize
    per_layer = {}
    for i, l in enumerate(blob_layers(net)):
        per_layer[l] = per_layer.get(l, 0) + net.learnable_params[i].count * item
    total = sum(per_layer.values())
    return min(total, cap + max(per_layer.values(), default=0))


class _StopGuard:
    """Node 0's callback: a stop request (Ctrl-C, SIGTERM) that arrives after this iteration's
    sync is deferred to the next one, where STOP tells every node to end at the same iteration
    and the shards send their history for the final snapshot."""

    def __init__(self, node):
        self.node = node

    def on_iteration(self, solver, loss, lr):
        node = self.node
        if solver.requested_stop and node.stop_at is None:
            solver.requested_stop = False
            node.pending_stop = True


class Node:
    """One node of a distributed run.  Built by ``minicaffe.dist.train`` around the Solver."""

    def __init__(
        self, solver, transport, staleness=0, workers=1, log=None, resume=False, gradient_slots=None, bucket_bytes=None
    ):
        self.solver, self.transport = solver, transport
        self.rank, self.world = transport.rank, transport.world
        self.staleness, self.n_workers = int(staleness), int(workers)
        self.log = log or solver.log
        self.resume = resume
        net = solver.net
        p = solver.param
        if self.rank != 0:  # node 0 tests, snapshots and writes files; the others only train
            p.test_interval = 0
            p.snapshot = 0
            p.snapshot_after_train = False
            p.test_initialization = False
        if staleness < 0:
            raise DistError(f"staleness must be >= 0 (0 = BSP), got {staleness}")
        self.iter_size = max(1, int(p.iter_size))
        self.layout = ParamLayout(net)
        self.n_blobs = len(net.learnable_params)
        self.blob_names = blob_names(net)
        self.dtype = net.dtype
        # -- data: every node reads the global batch (same seed, same order) and keeps its slice
        self.data_layers = [(i, layer) for i, layer in enumerate(net.layers) if isinstance(layer, DataLayer)]
        if not self.data_layers:
            raise DistError(
                f"net '{net.name}' has no data layer: data-parallel training shards the batch a data "
                f"layer reads (Input nets are not supported)"
            )
        self.node_bounds, self.worker_bounds = {}, {}
        for _, layer in self.data_layers:
            B = layer.batch_size
            if B < self.world * self.n_workers:
                raise DistError(
                    f"{self.world} nodes x {self.n_workers} workers need a batch of at least "
                    f"{self.world * self.n_workers}; layer '{layer.name}' has batch_size {B}"
                )
            lo, hi = shard_bounds(B, self.world)[self.rank]
            self.node_bounds[layer.name] = (lo, hi)
            self.worker_bounds[layer.name] = [(lo + a, lo + b) for a, b in shard_bounds(hi - lo, self.n_workers)]
        first = self.data_layers[0][1]
        self.batch = first.batch_size
        lo, hi = self.node_bounds[first.name]
        self.scale = (hi - lo) / self.batch  # this node's share of the global mean gradient
        self.worker_weights = [(b - a) / self.batch for a, b in self.worker_bounds[first.name]]
        # -- parameters: one flat W (every replica's blobs are views of it), gradient slots
        P = self.layout.count
        self.W = np.empty(P, self.dtype)
        self.layout.attach_data(self.W)
        # (wait-free backprop passes staleness + 2: clock c + 1's backward overwrites gradients
        # while clock c's lower layers may still be on their way to the shards)
        self.n_slots = max(self.staleness + 1, int(gradient_slots or 0))
        # gradient slots: clock c is computed into G[c % (s + 1)], which stays untouched until
        # every shard has it (a node starts clock c + s + 1 only after version c + 1 exists)
        self.G = np.zeros((self.n_slots, P), self.dtype)
        # the Solver's net shows this node's gradient: its diffs are views of a slot of G, the
        # one of the clock being computed (``_point_solver_diffs``); the node writes them, so the
        # Solver need not clear them first (``attach_solver``: the declared seam)
        self.layout.attach_diff(self.G[0])
        for t in solver.test_nets:
            t.share_with(net)
        sizes = {layer.name: [(b - a) for a, b in self.worker_bounds[layer.name]] for _, layer in self.data_layers}
        self.replicas = []
        for k in range(self.n_workers):
            r = build_replica(solver, self.data_layers, {name: s[k] for name, s in sizes.items()})
            lay = ParamLayout(r)
            lay.attach_data(self.W, copy=False)
            self.replicas.append((r, lay))
        self.Gk = None
        if self.n_workers == 1:
            self.replicas[0][1].attach_diff(self.G[0])
        else:
            self.Gk = np.zeros((self.n_workers, P), self.dtype)
            for k, (_, lay) in enumerate(self.replicas):
                lay.attach_diff(self.Gk[k])
        # -- this node's shard: planned in start() (the buckets depend on ``ps_blobs``)
        sp = p.copy()
        for field in ("test_iter", "test_net", "test_net_param", "test_state"):
            sp.clear(field)
        sp.random_seed = -1
        sp.clip_gradients = -1
        self._shard_param = sp
        self.clip = float(p.clip_gradients)
        self.bucket_bytes = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
        if self.bucket_bytes < 0:
            raise DistError(f"the bucket cap must be >= 0 bytes (0: one bucket per blob), got {self.bucket_bytes}")
        self.blob_layer = blob_layers(net)
        self.nbuf = [[np.zeros(1, np.float64) for _ in range(self.world)] for _ in range(self.n_slots)]
        # -- state shared between the compute thread, the receivers and the server thread
        # one lock, two conditions: ``cv`` wakes the threads that wait for parameters and
        # control (the compute thread, Poseidon's waits), ``work`` wakes the server thread only
        # when a bucket's gradients are all here (not on every frame that arrives)
        self.lock = threading.RLock()
        self.cv = threading.Condition(self.lock)
        self.work = threading.Condition(self.lock)
        self.wake_on_error = [self.work]  # more conditions on ``lock`` to wake when the run fails
        self.error = None
        self.arrivals = {}  # (clock, bucket) -> count of gradient slices arrived at this shard
        self.pushed = {}  # (clock, bucket) -> blobs of the bucket this node has pushed
        self.norm_arrivals = {}
        self.ready = []  # (clock, bucket) whose P slices are all here, in completion order
        self.applied = {}  # clock -> blobs updated by this shard
        self.hist_requests = set()
        self.hist_pending = 0
        self.stop_at = None
        self.pending_stop = False
        # what a node other than 0 still waits for from node 0 before its first clock
        self.init_pending = None if self.rank == 0 else {"state": None, "init": self.n_blobs, "hist": None}
        self.extra_handlers = {}
        # the extension point's switches (see the module docstring)
        self.ps_blobs = list(range(self.n_blobs))
        self.hooked_blobs = set()
        self.combined_by_hooks = False
        self.history_asked = False
        self.extra_waits = []
        self.plan_shards()  # (again in start(), once the extension point has set ps_blobs)
        self.clock = 0  # the clock being computed
        self.server_version = 0  # clocks below it are applied by this shard
        self.calls = 0
        self.iter0 = None
        # instrumentation
        self.wait_time = np.zeros(self.n_blobs)
        self.compute_time = 0.0
        self.sync_time = 0.0
        # where the CPU goes: [wall s, thread CPU s] per busy thread kind (the compute thread's
        # forward/backward, this shard's updates; Poseidon adds its SFB thread), and at the start
        # of every clock (clock, wall s, process user s, process system s, {kind: [wall, cpu]},
        # seconds in the garbage collector so far)
        self.busy = {"compute": [0.0, 0.0], "server": [0.0, 0.0]}
        self.cpu_marks = []
        self.gc_clock = GcClock()  # Python's garbage collector: seconds (in every mark) and passes
        self.timeline = []  # (thread, start, end, what) over the first `timeline_clocks` clocks
        self.timeline_clocks = 3
        self.timeline_start = 1  # set in start(): 10 where the run is long enough
        self.t_origin = time.perf_counter()
        first = self.replicas[0][0]
        self._t_layer = 0.0
        self.t_origin_wall = time.time()  # timelines of several machines are aligned on the wall clock
        self._hooks = first.add_hooks(
            before_forward=self._layer_start,
            after_forward=lambda l, net=first: self._layer_end(f"forward {net.layer_names[l]}"),
            before_backward=self._layer_start,
            after_backward=lambda l, net=first: self._layer_end(f"backward {net.layer_names[l]}"),
        )
        self.server = threading.Thread(target=self._serve, name="minicaffe-dist-server", daemon=True)
        self._stop_guard = _StopGuard(self)
        self._stop_server = False

    # -- start-up ----------------------------------------------------------------------------
    def start(self):
        """Connect the handler, agree on the initial state (rank 0's), start the server thread."""
        self.plan_shards()
        # what sync() pushes and waits for itself: every PS blob the hooks do not
        self.synced_here = [i for i in self.ps_blobs if i not in self.hooked_blobs]
        # with several workers: the ranges of G summed after the backward (the hooks sum theirs)
        hooked = self.hooked_blobs if self.combined_by_hooks else set()
        self.sum_ranges = []
        for i in range(self.n_blobs):
            if i in hooked:
                continue
            lo, hi = self.layout.offsets[i], self.layout.offsets[i] + self.layout.counts[i]
            if self.sum_ranges and self.sum_ranges[-1][1] == lo:
                lo = self.sum_ranges.pop()[0]
            self.sum_ranges.append((lo, hi))
        self.transport.start(self)
        solver = self.solver
        if self.rank == 0:
            solver.add_callback(self._stop_guard)
            state = {
                "iter": solver.iter,
                "current_step": solver.current_step,
                "data": {layer.name: layer.state_dict() for _, layer in self.data_layers},
                "resume": bool(self.resume),
            }
            for dst in range(1, self.world):
                self.transport.send(dst, F.STATE, 0, solver.iter, payload=F.encode_json(state))
                for i in range(self.n_blobs):
                    self.transport.send(dst, F.INIT, i, solver.iter, self.layout.slice(self.W, i))
                if self.resume:
                    for h, hist in enumerate(solver.history):
                        for i in range(self.n_blobs):
                            lo, hi = self.bounds[i][dst]
                            if hi > lo:
                                flat = hist[i].reshape(-1)
                                self.transport.send(dst, F.HIST, h * self.n_blobs + i, solver.iter, flat[lo:hi])
            self._load_own_shard(history=self.resume)
        else:
            with self.cv:
                deadline = time.monotonic() + 120
                while self.error is None and not self._init_done():
                    self.cv.wait(0.2)
                    if time.monotonic() > deadline:
                        raise DistError(f"node {self.rank}: no initial state from node 0 within 120 s")
                self._raise_if_failed()
                state = self.init_pending["state"]
            solver.iter = int(state["iter"])
            solver.current_step = int(state["current_step"])
            for _, layer in self.data_layers:
                layer.load_state_dict(state["data"][layer.name])
            self._load_own_shard(history=False)  # history slices were received into place
        self.iter0 = self.server_version = solver.iter
        self.gc_clock.start()
        left = solver.param.max_iter - solver.iter
        self.timeline_start = max(1, min(10, left - self.timeline_clocks))
        self.versions[self.versions < (1 << 60)] = solver.iter
        self._point_solver_diffs(solver.iter)
        self._refresh(range(self.n_blobs))
        self.shard_solver.iter = solver.iter
        self.shard_solver.current_step = solver.current_step
        self.server.start()

    def plan_shards(self):
        """Buckets and this node's shard of each.

        Every bucket (``plan_buckets``: consecutive blobs, one range of the flat vectors) is cut
        into P contiguous slices, and shard s owns slice s of every bucket; a blob's part of a
        shard is the intersection (``bounds[i][s]``, possibly empty: a bucket of small layers
        may leave a whole bias on one shard). So a bucket travels as one GRAD frame to each
        shard and one PARAM frame back, straight from and into the node's own vectors. Blobs
        the shards do not serve (``ps_blobs``: Poseidon's SFB layers) keep 1/P of each."""
        P, counts, offsets = self.world, self.layout.counts, self.layout.offsets
        plan = plan_buckets(counts, self.ps_blobs, self.blob_layer, self.dtype.itemsize, self.bucket_bytes)
        self.buckets = {b[0]: b for b in plan}  # key (its first blob) -> blobs
        self.bucket_of = {i: b[0] for b in plan for i in b}
        self.bucket_bounds = {}  # key -> [(lo, hi)] per shard, in the flat vectors
        self.bounds = [shard_bounds(n, P) for n in counts]
        for key, blobs in self.buckets.items():
            start = offsets[key]
            n = sum(counts[i] for i in blobs)
            self.bucket_bounds[key] = [(start + lo, start + hi) for lo, hi in shard_bounds(n, P)]
            for i in blobs:
                a, z = offsets[i], offsets[i] + counts[i]
                self.bounds[i] = [
                    (min(max(lo, a), z) - a, max(min(max(lo, a), z), min(hi, z)) - a)
                    for lo, hi in self.bucket_bounds[key]
                ]
        # what a clock's backward adds into G, so what is zeroed before it: the PS blobs' ranges
        # (an SFB layer's replicas skip their weight gradient: it is rebuilt from the factors)
        self.zero_ranges = []
        for i in sorted(self.ps_blobs):
            lo, hi = offsets[i], offsets[i] + counts[i]
            if self.zero_ranges and self.zero_ranges[-1][1] == lo:
                lo = self.zero_ranges.pop()[0]
            self.zero_ranges.append((lo, hi))
        mine = [b[self.rank] for b in self.bounds]
        # the shard's parameters in one vector, blob after blob: a bucket's slice is contiguous
        self.shard_offsets = np.concatenate([[0], np.cumsum([hi - lo for lo, hi in mine])]).astype(int)
        self.shard_W = np.empty(int(self.shard_offsets[-1]), self.dtype)
        self.shard_net = ShardNet(self.solver.net, [hi - lo for lo, hi in mine])
        for i, blob in enumerate(self.shard_net.learnable_params):
            blob.attach(self.shard_W[self.shard_offsets[i] : self.shard_offsets[i + 1]], blob.flat_diff)
        self.shard_solver = solver_class(self.solver.type)(self._shard_param, train_net=self.shard_net, log=_quiet)
        # receive buffers of the shard, the same layout: [slot][src] -> one vector per peer
        self.gflat = [
            [np.empty(self.shard_W.size, self.dtype) if s != self.rank else None for s in range(P)]
            for _ in range(self.n_slots)
        ]
        self.gbuf = [
            [
                [g[self.shard_offsets[i] : self.shard_offsets[i + 1]] for i in range(self.n_blobs)]
                if g is not None
                else None
                for g in row
            ]
            for row in self.gflat
        ]
        # the buckets this shard updates (a bucket smaller than P elements leaves some shards none)
        self.served = [b for b in sorted(self.buckets) if self._mine(b, self.shard_W).size]
        self.n_served = sum(len(self.buckets[b]) for b in self.served)
        self.versions = np.zeros((self.n_blobs, P), np.int64)  # slice version per (blob, shard)
        for i, b in enumerate(self.bounds):
            for s, (lo, hi) in enumerate(b):
                if hi == lo:
                    self.versions[i, s] = 1 << 60  # an empty slice is always fresh
        self.fresh = [0] * self.n_blobs
        self._refresh(range(self.n_blobs))

    def _refresh(self, blobs):
        """``fresh[i]``: the version every slice of blob i has (the minimum over the shards), as a
        plain int, kept with ``versions`` (under the lock) so that ``wait_params`` can see that a
        blob is fresh without the lock or a numpy reduction: the common case, once per layer per
        forward with wait-free backprop. ``blobs``: consecutive (a bucket, or every blob), so one
        reduction over their rows does (a PARAM frame of CIFAR-10 quick's 10-blob bucket: 2 us,
        where one per blob took 12)."""
        if len(blobs):
            lo, hi = blobs[0], blobs[-1] + 1
            self.fresh[lo:hi] = self.versions[lo:hi].min(axis=1).tolist()

    def _mine(self, key, flat):
        """This shard's slice of bucket ``key`` in a vector laid out as ``shard_W``."""
        blobs = self.buckets[key]
        return flat[self.shard_offsets[blobs[0]] : self.shard_offsets[blobs[-1] + 1]]

    def bucket_name(self, key):
        """'conv1/w' for a bucket of one blob, 'conv1+conv2' for whole layers."""
        blobs = self.buckets.get(key)
        if blobs is None:
            return str(key)
        if len(blobs) == 1:
            return self.blob_names[key]
        names = []
        for i in blobs:
            name = self.blob_names[i].rsplit("/", 1)[0]
            if name not in names:
                names.append(name)
        return "+".join(names)

    def bucket_plan(self):
        """The buckets as text, for the start-up log."""
        cap = f"{self.bucket_bytes / 1024:g} KiB" if self.bucket_bytes else "0 (one per blob)"
        lines = [
            f"gradient buckets (cap {cap}, last layers first): {len(self.buckets)} for {len(self.ps_blobs)} PS blob(s)"
        ]
        for key in sorted(self.buckets, reverse=True):
            n = sum(self.layout.counts[i] for i in self.buckets[key])
            lines.append(f"  {self.bucket_name(key):<24} {n * self.dtype.itemsize / 1024:>10.1f} KiB")
        return "\n".join(lines)

    def _init_done(self):
        p = self.init_pending
        if p["state"] is None or p["init"] > 0:
            return False
        return not p["state"].get("resume") or p["hist"] == 0

    def _load_own_shard(self, history):
        for i in range(self.n_blobs):
            lo, hi = self.bounds[i][self.rank]
            self.shard_net.learnable_params[i].flat_data[...] = self.layout.slice(self.W, i)[lo:hi]
            if history:
                for h, hist in enumerate(self.solver.history):
                    self.shard_solver.history[h][i].reshape(-1)[...] = hist[i].reshape(-1)[lo:hi]

    # -- the transport's handler -------------------------------------------------------------
    def destination(self, src, h):
        kind, i = h.kind, h.key
        if kind == F.INIT and not 0 <= i < self.n_blobs:
            raise F.FrameError(f"{F.KIND_NAMES[kind]} for blob {i}; the net has {self.n_blobs}")
        if kind in (F.GRAD, F.PARAM) and i not in self.buckets:
            raise F.FrameError(f"{F.KIND_NAMES[kind]} for key {i}, which is not the first blob of a bucket")
        if kind == F.GRAD:
            with self.cv:
                v = self.server_version if self.server.is_alive() else None
            if v is not None and not v <= h.clock <= v + self.staleness:
                raise F.FrameError(f"gradient of clock {h.clock} while this shard is at version {v}")
            return self._mine(i, self.gflat[h.clock % self.n_slots][src])
        if kind == F.PARAM:
            lo, hi = self.bucket_bounds[i][src]
            return self.W[lo:hi]
        if kind == F.INIT:
            if self.rank == 0 or src != 0:
                raise F.FrameError("INIT frames come only from node 0 to the others")
            return self.layout.slice(self.W, i)
        if kind == F.HIST:
            h_i, i = divmod(h.key, self.n_blobs)
            if not 0 <= h_i < len(self.solver.history):
                raise F.FrameError(f"HIST key {h.key} out of range")
            if self.rank == 0:  # a shard's answer to HIST_REQ: into the solver's history
                lo, hi = self.bounds[i][src]
                return self.solver.history[h_i][i].reshape(-1)[lo:hi]
            return self.shard_solver.history[h_i][i].reshape(-1)
        if kind == F.NORM:
            return self.nbuf[h.clock % self.n_slots][src]
        if kind in self.extra_handlers:
            return self.extra_handlers[kind].destination(src, h)
        return None

    def arrived(self, src, h, array):
        kind = h.kind
        if kind in self.extra_handlers:
            return self.extra_handlers[kind].arrived(src, h, array)
        if kind == F.GRAD:  # wakes the server thread only once the bucket is complete
            with self.cv:
                self._count_gradient(h.clock, h.key)
            return
        with self.cv:
            if kind == F.PARAM:
                for i in self.buckets[h.key]:
                    if self.bounds[i][src][1] > self.bounds[i][src][0]:
                        self.versions[i, src] = h.clock
                self._refresh(self.buckets[h.key])
            elif kind == F.INIT and self.init_pending is not None:
                self.init_pending["init"] -= 1
            elif kind == F.HIST:
                if self.rank == 0:
                    self.hist_pending -= 1
                elif self.init_pending is not None and self.init_pending["hist"] is not None:
                    self.init_pending["hist"] -= 1
            elif kind == F.NORM:
                self.norm_arrivals[h.clock] = self.norm_arrivals.get(h.clock, 0) + 1
            self.cv.notify_all()

    def control(self, src, h, payload):
        if h.kind in self.extra_handlers:
            return self.extra_handlers[h.kind].control(src, h, payload)
        late = False
        with self.cv:
            if h.kind == F.STATE and self.init_pending is not None:
                state = F.decode_json(payload, f"node {src}")
                self.init_pending["state"] = state
                if state.get("resume"):
                    self.init_pending["hist"] = sum(
                        len(self.solver.history) for i in range(self.n_blobs) if np.diff(self.bounds[i][self.rank])[0]
                    )
            elif h.kind == F.HIST_REQ:
                # with wait-free backprop this shard may have applied that clock already
                late = self.server_version >= h.clock
                if not late:
                    self.hist_requests.add(h.clock)
            elif h.kind == F.STOP:
                self.stop_at = h.clock
            elif h.kind == F.ABORT:
                reason = bytes(payload).decode(errors="replace")
                self._set_error(f"node {src} stopped the run: {reason}")
            else:
                raise F.FrameError(f"unexpected {F.KIND_NAMES[h.kind]} frame", f"node {src}")
            self.cv.notify_all()
        if late:
            self._send_history(h.clock)

    def failed(self, message):
        with self.cv:
            first = self.error is None
            self._set_error(message)
        if first:  # tell the others why (they may not have seen it themselves)
            for dst in range(self.world):
                if dst != self.rank:
                    try:
                        self.transport.send(dst, F.ABORT, 0, self.clock, payload=message.encode())
                    except Exception:  # noqa: BLE001  (best effort)
                        pass

    def _set_error(self, message):
        if self.error is None:
            self.error = message
        self.cv.notify_all()
        for cv in self.wake_on_error:
            cv.notify_all()

    def _raise_if_failed(self):
        if self.error is not None:
            raise DistError(f"node {self.rank}: {self.error} (at iteration {self.solver.iter})")

    def _now(self):
        return time.perf_counter() - self.t_origin

    def recording(self, clock):
        """The timeline covers ``timeline_clocks`` clocks from ``timeline_start`` on (the first
        clocks compile kernels, test, and let the nodes fall into step). An extension that runs
        work of its own (Poseidon's SFB thread) records it in ``timeline`` in these clocks too."""
        return 0 <= clock - (self.iter0 or 0) - self.timeline_start < self.timeline_clocks

    def _layer_start(self, layer_index):
        self._t_layer = self._now()

    def _layer_end(self, label):
        if self.recording(self.clock):
            self.timeline.append(("compute", self._t_layer, self._now(), label))

    # -- the server shard ----------------------------------------------------------------------
    def _count_gradient(self, clock, b):
        key = (clock, b)
        n = self.arrivals.get(key, 0) + 1
        self.arrivals[key] = n
        if n == self.world:
            del self.arrivals[key]
            self.ready.append(key)
            self.work.notify()

    def _serve(self):
        """The shard's server thread: reduce and update each (clock, bucket) whose slices are all here."""
        try:
            while True:
                with self.cv:
                    while not self.ready and not self._stop_server and self.error is None:
                        self.work.wait(0.5)
                    if self.error is not None or (self._stop_server and not self.ready):
                        return
                    batch = list(self.ready)
                    self.ready.clear()
                for clock, b in batch:
                    if self.clip >= 0:
                        self._serve_clipped(clock, b)
                    else:
                        self._update(clock, [b])
        except Exception as exc:  # noqa: BLE001  (stops the run with the reason)
            self.failed(f"the server shard on node {self.rank} failed: {type(exc).__name__}: {exc}")

    def _reduce(self, clock, i):
        slot = clock % self.n_slots
        lo, hi = self.bounds[i][self.rank]
        d = self.shard_net.learnable_params[i].flat_diff
        for src in range(self.world):
            part = self.G[slot][self.layout.offsets[i] + lo : self.layout.offsets[i] + hi] if src == self.rank else None
            part = part if part is not None else self.gbuf[slot][src][i]
            if src == 0:
                d[...] = part
            else:
                d += part

    def _serve_clipped(self, clock, b):
        """clip_gradients: the update of a clock needs the global norm, so wait for every bucket."""
        for i in self.buckets[b]:
            self._reduce(clock, i)
        done = self.applied.setdefault(("reduced", clock), set())
        done.add(b)
        if len(done) < len(self.served):
            return
        del self.applied[("reduced", clock)]
        slot = clock % self.n_slots
        mine = sum(float(np.dot(p.flat_diff, p.flat_diff)) for p in self.shard_net.learnable_params)
        self.nbuf[slot][self.rank][0] = mine
        for dst in range(self.world):
            if dst != self.rank:
                self.transport.send(dst, F.NORM, 0, clock, self.nbuf[slot][self.rank])
        with self.cv:
            while self.norm_arrivals.get(clock, 0) < self.world - 1 and self.error is None:
                self.cv.wait(0.5)
            if self.error is not None:
                return
            self.norm_arrivals.pop(clock, None)
        norm = float(np.sqrt(sum(float(self.nbuf[slot][s][0]) for s in range(self.world))))
        if norm > self.clip:
            scale = self.clip / norm
            for p in self.shard_net.learnable_params:
                p.flat_diff[...] *= scale
            if self.rank == 0:
                self.log(
                    f"Gradient clipping: scaling down gradients (L2 norm {norm:.6g} > {self.clip:g}) by {scale:.6g}"
                )
        self._update(clock, self.served, reduced=True)

    def _update(self, clock, buckets, reduced=False):
        """Reduce and update this shard's slice of each bucket, send it to every node (one PARAM
        frame per bucket and node) and into this node's own parameter vector."""
        ss = self.shard_solver
        t0, c0 = self._now(), time.thread_time()
        if ss.iter != clock:
            ss.iter = clock
            self._rate = ss.learning_rate()
        elif not hasattr(self, "_rate"):
            self._rate = ss.learning_rate()
        for b in buckets:
            blobs = self.buckets[b]
            for i in blobs:
                if not reduced:
                    self._reduce(clock, i)
                lo, hi = self.bounds[i][self.rank]
                if hi > lo:
                    ss.update_parameter(i, self._rate)
            fresh = self._mine(b, self.shard_W)
            # this shard's own state first, the frames after: a node that has every slice of
            # version c + 1 may push gradients of clock c + 1 at once (with WFBP during its next
            # backward), and they must find this shard at version c + 1 even where the server
            # thread loses the core between the two steps
            with self.cv:
                lo, hi = self.bucket_bounds[b][self.rank]
                self.W[lo:hi] = fresh
                done = self.applied.setdefault(clock, set())
                for i in blobs:
                    self.versions[i, self.rank] = max(self.versions[i, self.rank], clock + 1)
                    done.add(i)
                self._refresh(blobs)
                complete = len(done) == self.n_served
                if complete:
                    del self.applied[clock]
                    self.server_version = clock + 1
                self.cv.notify_all()
            if fresh.size:
                for dst in range(self.world):
                    if dst != self.rank:
                        self.transport.send(dst, F.PARAM, b, clock + 1, fresh)
            if complete and (clock + 1) in self.hist_requests:
                self._send_history(clock + 1)
                with self.cv:  # only now: node 0's snapshot waits for this
                    self.hist_requests.discard(clock + 1)
                    self.cv.notify_all()
        with self.cv:
            self.busy["server"][0] += self._now() - t0
            self.busy["server"][1] += time.thread_time() - c0
        if self.recording(clock):
            buckets = list(buckets)
            what = self.bucket_name(buckets[0]) if len(buckets) == 1 else f"{len(buckets)} buckets"
            self.timeline.append(("server", t0, self._now(), f"update {what}"))

    def _send_history(self, version):
        ss = self.shard_solver
        for h, hist in enumerate(ss.history):
            for i in self.ps_blobs:
                lo, hi = self.bounds[i][self.rank]
                if hi <= lo:
                    continue
                if self.rank == 0:
                    self.solver.history[h][i].reshape(-1)[lo:hi] = hist[i].reshape(-1)
                else:
                    self.transport.send(0, F.HIST, h * self.n_blobs + i, version, hist[i].reshape(-1))

    # -- the worker side: gradients and the extension point -------------------------------------
    def grad(self, i, clock=None):
        slot = (self.clock if clock is None else clock) % self.n_slots
        return self.layout.slice(self.G[slot], i)

    def params(self, i):
        return self.layout.slice(self.W, i)

    def push(self, i, clock=None):
        """Blob i's gradient of ``clock`` is final: scale it by this node's share; once every blob
        of its bucket is, sync the bucket (send every shard its slice: queued, returns at once;
        count our own slice at our shard)."""
        clock = self.clock if clock is None else clock
        g = self.grad(i, clock)
        g *= self.scale
        b = self.bucket_of[i]
        blobs = self.buckets[b]
        if len(blobs) > 1:
            with self.cv:
                key = (clock, b)
                n = self.pushed.get(key, 0) + 1
                if n < len(blobs):
                    self.pushed[key] = n
                    return
                self.pushed.pop(key, None)
        t = self._now()
        G = self.G[clock % self.n_slots]
        for s, (lo, hi) in enumerate(self.bucket_bounds[b]):
            if hi == lo:
                continue  # (a bucket smaller than P elements: shard s has none of it)
            if s == self.rank:
                with self.cv:
                    self._count_gradient(clock, b)
            else:
                self.transport.send(s, F.GRAD, b, clock, G[lo:hi])
        if self.recording(clock):
            self.timeline.append(("compute", t, self._now(), f"push {self.bucket_name(b)}"))

    def wait_params(self, i, version):
        """Block until every slice of blob i has at least ``version``."""
        if self.fresh[i] >= version and self.error is None:  # (an int that only grows: no lock)
            return
        t0 = time.perf_counter()
        with self.cv:
            while self.error is None and self.fresh[i] < version:
                if self.stop_at is not None and version > self.stop_at:
                    break  # node 0 stopped the run (Ctrl-C) before this version
                self.cv.wait(0.5)
            self._raise_if_failed()
        self.wait_time[i] += time.perf_counter() - t0

    # -- what the Solver calls -------------------------------------------------------------
    def gradient_source(self):
        """Stands in for ``net.forward_backward()``: this node's slice of the global batch."""
        self._raise_if_failed()
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.calls % self.iter_size == 0:  # a new clock: zero its gradient slot
            self.clock = self.solver.iter
            if len(self.cpu_marks) < 10000:
                r = resource.getrusage(resource.RUSAGE_SELF)  # (os.times() counts 10 ms ticks)
                u, k = r.ru_utime, r.ru_stime
                with self.cv:
                    busy = {name: list(v) for name, v in self.busy.items()}
                self.cpu_marks.append((self.clock, t0 - self.t_origin, u, k, busy, self.gc_clock.seconds))
            self.transport.stats.recording = self.recording(self.clock)
            past = self.clock - self.iter0 >= self.timeline_start + self.timeline_clocks
            if past and self._hooks is not None:
                self._hooks.remove()  # the timeline covers the first clocks only
                self._hooks = None
            if self.hooked_blobs:
                self.history_asked = self._ask_history(self.clock + 1)
            G = self.G[self.clock % self.n_slots]
            if self.n_workers == 1 and self.n_slots > 1:
                point_diffs(self.replicas[0][1], G)
            self._zero(G)
        self.calls += 1
        batch = {layer.name: layer.next_batch() for _, layer in self.data_layers}
        losses = [0.0] * self.n_workers

        def work(k):
            net, _ = self.replicas[k]
            for _, layer in self.data_layers:
                lo, hi = self.worker_bounds[layer.name][k]
                blobs = [net.blobs[t] for t in layer.param.top]
                for blob, arr in zip(blobs, batch[layer.name]):
                    if arr is not None:
                        blob.data[...] = arr[lo:hi].reshape(blob.shape)
            if self.Gk is not None:
                self._zero(self.Gk[k])
            losses[k] = net.forward_backward()

        if self.n_workers == 1:
            work(0)
        else:
            threads = [threading.Thread(target=work, args=(k,)) for k in range(self.n_workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            G = self.G[self.clock % self.n_slots]
            w = np.array(self.worker_weights, self.dtype) / self.scale
            for lo, hi in self.sum_ranges:
                G[lo:hi] += w @ self.Gk[:, lo:hi]
        self.compute_time += time.perf_counter() - t0
        with self.cv:
            self.busy["compute"][0] += time.perf_counter() - t0
            self.busy["compute"][1] += time.thread_time() - c0
        w = np.array(self.worker_weights) / self.scale
        for name in self.solver.net.outputs:  # what the Solver displays: this node's slice
            self.solver.net.blobs[name].data[...] = sum(
                wk * np.asarray(r.blobs[name].data) for wk, (r, _) in zip(w, self.replicas)
            )
        return float(np.dot(w, losses))

    def _zero(self, flat):
        """Zero what the backward accumulates into (``zero_ranges``); the rest is never written."""
        for lo, hi in self.zero_ranges:
            flat[lo:hi] = 0

    def _point_solver_diffs(self, clock):
        """The Solver's net's diffs: views of clock ``clock``'s gradient slot.  Pointed at the
        next clock's slot as soon as ``sync()`` returns, where that slot is free (a node starts
        clock c only once clock c - n_slots has been applied everywhere): a Solver that clears
        them anyway (a gradient source set without ``overwrites``, iter_size > 1) clears a slot
        that is zeroed before use, never one still on its way to the shards."""
        if self.n_slots > 1:  # (one slot: they stay on G[0])
            point_diffs(self.layout, self.G[clock % self.n_slots])

    def attach_solver(self):
        """Join the Solver through its declared seams: the gradient source (this node's slice of
        the batch; it writes the diffs the Solver's net shows, so with iter_size 1 the Solver
        does not clear them first) and the updater (the shards)."""
        self.solver.set_gradient_source(self.gradient_source, overwrites=self.iter_size == 1)
        self.solver.set_updater(self.updater)

    def detach_solver(self):
        self.solver.set_gradient_source(None)
        self.solver.set_updater(None)

    def _ask_history(self, nxt):
        """Node 0, before a snapshot at version ``nxt``: ask every shard for its history slices
        (they answer once their update of clock nxt - 1 is done, or at once if it is).  -> asked?
        With wait-free backprop (``hooked_blobs``) this runs when the clock starts: the pushes
        leave during the backward, so a shard could finish the clock, and its node the run,
        before a request sent from ``sync()`` reached it."""
        p, solver = self.solver.param, self.solver
        want = (
            self.rank == 0
            and bool(self.ps_blobs)
            and (
                (p.snapshot and nxt % p.snapshot == 0)
                or (nxt >= p.max_iter and p.snapshot_after_train)
                or (self.stop_at is not None and nxt >= self.stop_at)
            )
        )
        if not want:
            return False
        with self.cv:
            self.hist_pending += sum(
                len(solver.history)
                for s in range(1, self.world)
                for i in self.ps_blobs
                if self.bounds[i][s][1] > self.bounds[i][s][0]
            )
            late = self.server_version >= nxt  # wait-free backprop: the update may be done
            if not late:
                self.hist_requests.add(nxt)
        if late:
            self._send_history(nxt)
        for dst in range(1, self.world):
            self.transport.send(dst, F.HIST_REQ, 0, nxt)
        return True

    def sync(self):
        """The default schedule: push every blob (last layer first), then wait for the versions
        this node may compute the next clock with."""
        t0 = time.perf_counter()
        c = self.clock
        solver, p = self.solver, self.solver.param
        nxt = c + 1
        exact = (
            (p.snapshot and nxt % p.snapshot == 0)
            or (p.test_interval and nxt % p.test_interval == 0)
            or nxt >= p.max_iter
            or solver.requested_stop
            or self.pending_stop
            or (self.stop_at is not None and nxt >= self.stop_at)
        )
        if self.rank == 0 and (solver.requested_stop or self.pending_stop) and self.stop_at is None:
            self.stop_at = nxt
            for dst in range(1, self.world):
                self.transport.send(dst, F.STOP, 0, nxt)
        want_hist = self.history_asked or self._ask_history(nxt)
        self.history_asked = False
        for i in reversed(self.synced_here):
            self.push(i, c)
        version = nxt if exact else nxt - self.staleness
        for i in self.ps_blobs if exact else self.synced_here:
            self.wait_params(i, version)
        for wait in self.extra_waits:
            wait(version, exact)
        if want_hist:
            with self.cv:
                while self.error is None and (self.hist_pending > 0 or nxt in self.hist_requests):
                    self.cv.wait(0.5)
                self._raise_if_failed()
        if self.stop_at is not None and nxt >= self.stop_at:
            solver.requested_stop = True
        self._point_solver_diffs(nxt)
        self.sync_time += time.perf_counter() - t0
        if self.recording(c):
            self.timeline.append(("compute", t0 - self.t_origin, self._now(), "wait for parameters"))

    def updater(self, solver, rate):
        """The Solver's update step, done by the shards (the Solver computed ``rate`` itself;
        each shard computes the same from the same policy and iteration)."""
        self.sync()

    # -- the end -------------------------------------------------------------------------------
    def finish(self):
        """Let the server thread drain, say goodbye; -> every node's statistics (on rank 0)."""
        self._remove_guard()
        self.gc_clock.stop()
        with self.cv:
            self._stop_server = True
            self.cv.notify_all()
            self.work.notify_all()
        self.server.join(30)
        self.transport.flush()  # the last parameters this node broadcast are counted in its report
        mine = self.report()
        if self.error is not None:
            self.transport.shutdown()
            return {self.rank: mine}
        others = self.transport.close(stats=mine)
        out = {self.rank: mine}
        out.update({int(r): s for r, s in others.items()})
        return out

    def abort(self):
        self._remove_guard()
        self.gc_clock.stop()
        self.transport.shutdown()

    def _remove_guard(self):
        if self.rank == 0 and any(cb is self._stop_guard for cb in self.solver.callbacks):
            self.solver.remove_callback(self._stop_guard)

    def key_name(self, kind, key):
        """The blob a frame's key names (an extra handler's own kinds name their keys themselves)."""
        if kind in self.extra_handlers:
            return self.extra_handlers[kind].key_name(kind, key)
        if kind in (F.GRAD, F.PARAM):
            return self.bucket_name(key)
        return self.blob_names[key] if 0 <= key < self.n_blobs else str(key)

    def report(self):
        """Per-layer bytes and waiting, compute vs sync time: for the log and train_log.json."""
        clocks = max(self.solver.iter - (self.iter0 or 0), 1)
        per = self.transport.stats.by_key()
        sent, received = self.transport.stats.totals()
        layers = {  # per bucket (a blob, or whole layers): its frames carry the bucket's first blob as key
            self.bucket_name(b): {
                "sent": per.get(b, [0, 0])[0],
                "received": per.get(b, [0, 0])[1],
                "wait_s": float(sum(self.wait_time[i] for i in blobs)),
            }
            for b, blobs in sorted(self.buckets.items())
        }
        return {
            "rank": self.rank,
            "iterations": clocks,
            "bytes_sent": sent,
            "bytes_received": received,
            "bytes_per_iter": (sent + received) / clocks,
            "compute_s": self.compute_time,
            "sync_s": self.sync_time,
            "wait_s": float(self.wait_time.sum()),
            "busy": {name: list(v) for name, v in self.busy.items()},
            "cpu_marks": self.cpu_marks,
            "gc_s": self.gc_clock.seconds,
            "gc_passes": list(self.gc_clock.passes),  # collections of generation 0, 1, 2
            "layers": layers,
            "t_origin": self.t_origin_wall,
            "timeline": self.timeline[:4000]
            + [
                (lane, t0 - self.t_origin, t1 - self.t_origin, f"{F.KIND_NAMES[kind]} {self.key_name(kind, key)}")
                for lane, t0, t1, kind, key in self.transport.stats.events[:4000]
            ],
        }
