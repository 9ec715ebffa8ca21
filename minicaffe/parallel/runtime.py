"""SingleCaffe in one process: a parameter-server thread and N workers.

Who does what, every iteration c (a *clock*: one global batch)::

    server (the thread that calls solve/step: it owns the Solver)
        fetch the global batch c + 1 from the Data layer's reader -> batches[c + 1]
        wait until the N workers are done with c
        G  = sum_k  (b_k / B) G_k[c]           one dot over the flat gradient vectors
        the Solver's own update: lr policy, clipping, weight decay, momentum/Adam..., W -= step
        applied = c + 1; wake the workers
    worker k (a thread, its own replica net of batch b_k, its own activations)
        wait until batch c is there and applied >= c - s      (s = staleness; 0 = BSP)
        copy its slice [lo_k, hi_k) of batch c into its Input blobs
        G_k[c] = 0; forward; backward                         (reads W, writes only G_k)

Under BSP the server's own thread is worker 0 (``server_computes``, the default; as in Caffe,
whose root solver trains in the thread that called Solve): right after fetching, it computes
worker 0's shard itself, then waits for the others.  Only workers 1..N-1 are threads, so two
workers on two cores are two threads, not three: no wake-up of a parked worker 0 at the start
of a clock, no wake-up of the server at its end, and the server's own Python (the Solver's loop,
the fetch) no longer preempts a worker bound to its core.  SSP keeps N worker threads (they run
ahead of the server, which then must not compute).

The sharded update (shard.py; any rule with L2 decay on the CPU, BSP, no clipping,
iter_size 1): the
server publishes iteration c's learning rate in its ``on_start`` callback and, in the Solver's
updater seam, only waits; once all N gradients of c are in, each worker sums them and applies
the Solver's update on its own range of the parameters (one fused pass), and the last one to finish
sets applied = c + 1.  The server's gemv and update no longer run while every worker waits.

Memory: every replica's parameter blobs are views of *one* flat vector W (written by the server,
or, in the sharded update, by each worker on its own range between two clocks); each worker
writes its own gradient vector G_k, so gradients are aggregated without a lock: no two threads
ever write the same bytes.  W, G, the solver's history,
the workers' gradient slots and every net's planned activations are sections of one arena.

Threads run at the same time because the heavy work releases the GIL: numba kernels are compiled
with nogil=True, numpy's BLAS calls and ufuncs release it.  BLAS threads are set to cores // N
so N workers do not oversubscribe the cores (see blas.py).

BSP (s = 0): worker k computes clock c from the parameters after update c-1, exactly as one
thread on the whole batch would (up to the order of float32 sums).  SSP (s > 0): a worker may
compute clock c from parameters as old as update c-1-s, so it never waits for a slower worker or
for the server's update unless it is s clocks ahead; the server still applies one update per
global batch, in clock order, from all N gradients (so the step size is the one of the solver).
A worker that reads W while the server writes it may see a mix of two versions (as in Hogwild and
SingleCaffe's asynchronous mode); BSP never does.

Thread lifetime: the N worker threads are started by the trainer's first ``step``/``solve`` and
live until ``close()`` (or the end of a ``with ParallelTrainer(...)`` block, or the trainer's
garbage collection, or the interpreter's exit).  Between runs they are *parked* on the workers'
condition, holding only a weak reference to the trainer, so ``step(1)`` in a loop starts and
joins no thread (as Caffe's P2PSync threads live for the whole solve).  A worker parks by itself
after the run's last clock, so a run that ends where it was meant to (nothing fetched ahead,
every update applied) neither wakes nor waits for them.  A run that ends any other way (an error, Ctrl-C, a stop request with
batches fetched ahead, an abandoned iteration) stops and joins them before step() returns or
raises, and the next run starts new ones: no worker thread runs on after an error.

Faults: an exception in a worker stops the run: the server raises WorkerError (a SolverError that
names the worker and the iteration, chained to the original) and no snapshot is written after it,
so the last periodic snapshot is the one kept.  A worker that has not delivered an iteration
``worker_timeout`` seconds (default 300) after the server asked for it is *hung*: the server
stops the run, snapshots the last consistent parameters (those after the last completed update:
a sharded update starts only once every gradient of the clock is in, so a worker hung in its
forward or backward never leaves W half updated; a deadline missed inside the update itself ends
the run without that snapshot) and raises WorkerTimeout naming the worker thread and the iteration.
A non-finite loss names the worker whose shard produced it and where (minicaffe.checks).
Ctrl-C (or SIGTERM, in the train tool): the first sets ``solver.requested_stop``, which the
server also sees while it waits for the workers: a finished iteration ends the run normally; an
iteration stuck in a worker is abandoned, the last consistent parameters are snapshotted, and the
hung worker is named.  A second Ctrl-C aborts.  A worker thread still busy 5 s after the run
ended badly is left behind (a daemon thread, reported); that trainer then refuses to run again.
"""

import math
import os
import signal
import threading
import time
import weakref

import numpy as np

from ..errors import SolverError
from ..layers.data_base import DataLayer
from ..memory.flat import ParamLayout
from ..memory.planner import Arena, history_buffers, plan_net
from . import blas
from .replica import build_replica, shard_bounds
from .shard import Rule, ShardPlan, rates_and_decays, why_not


class WorkerError(SolverError):
    """A worker thread raised; ``worker``, ``iteration`` and the original as ``__cause__``."""

    def __init__(self, worker, iteration, error):
        self.worker, self.iteration, self.error = worker, iteration, error
        super().__init__(f"worker {worker} failed at iteration {iteration}: {type(error).__name__}: {error}")


class WorkerTimeout(WorkerError):
    """A worker thread missed its deadline (``worker_timeout``); ``snapshot`` is the state
    written of the last consistent parameters."""

    def __init__(self, worker, iteration, seconds, thread_name, snapshot=None):
        self.worker, self.iteration, self.error = worker, iteration, None
        self.seconds, self.thread_name, self.snapshot = seconds, thread_name, snapshot
        SolverError.__init__(self, self.describe())

    def describe(self):
        text = (
            f"worker {self.worker} ({self.thread_name}) has not finished iteration {self.iteration} within "
            f"{self.seconds:g} s (worker_timeout): it is hung"
        )
        if self.snapshot:
            text += f"; the parameters after the last completed update are in {self.snapshot}"
        return text


class _Abandoned(Exception):
    """Raised inside the Solver's loop to leave an iteration the workers cannot finish."""

    def __init__(self, late, consistent=True):
        self.late = late  # [(worker, thread name, iteration)] not done
        self.consistent = consistent  # False: a sharded update was under way, W is mixed


#: seconds a worker may take for one iteration before it is called hung
DEFAULT_WORKER_TIMEOUT = 300.0
#: after a stop request, seconds the server still waits for the iteration under way
STOP_GRACE = 1.0


class ParallelTrainer:
    """Train ``solver``'s net with ``n_workers`` replica threads and this thread as the server.

    ``staleness``: 0 = BSP (the default), s > 0 = SSP with bound s.
    ``blas_threads``: BLAS threads per process while training (default cores // n_workers).
    ``recompute``: convolutions recompute im2col in backward (less memory, a little more time).
    ``worker_timeout``: seconds a worker may take to deliver one iteration (None: no deadline).
    ``shard_update``: where it applies (shard.py), the workers do the server's reduce and the
    update, each on its own range of the parameters (default); False: the server does both.
    ``pin``: bind worker k to core k, so that its replica, its gradients and its range of the
    parameters stay in that core's caches from one step to the next; None (default) pins when
    the workers, one BLAS thread and one lane each, fill the cores exactly (Linux only).
    ``server_computes``: under BSP the thread that calls ``step``/``solve`` computes worker 0's
    shard itself between its server duties, and only workers 1..N-1 are threads (default True);
    False: N worker threads and a server that only waits (as SSP always has).
    Use ``solve()`` / ``step(n)`` as the Solver's; ``stats()`` says where the time went;
    ``memory_sections()`` feeds minicaffe.memory.report.
    """

    def __init__(
        self,
        solver,
        n_workers=2,
        staleness=0,
        blas_threads=None,
        recompute=False,
        log=None,
        worker_timeout=DEFAULT_WORKER_TIMEOUT,
        shard_update=True,
        pin=None,
        server_computes=True,
    ):
        if worker_timeout is not None and not worker_timeout > 0:
            raise SolverError(f"worker_timeout must be a positive number of seconds (or None), got {worker_timeout}")
        self.worker_timeout = worker_timeout
        self.shard_update = bool(shard_update)
        self.pin = pin
        # BSP: the server's own thread computes worker 0's shard (as Caffe's root solver does)
        self.inline = bool(server_computes) and staleness == 0
        self._generation, self._left_behind = 0, []  # the run under way (or the last one)
        self._saved_affinity = None  # the calling thread's cores while it is pinned as worker 0
        self._pool, self._closed = None, False  # the parked worker threads (started by the first run)
        self._shard_plans = {}  # ShardPlan per (lr_mults, decays): built once, reused by every run
        self._announced = None  # the configuration the last 'Training with ...' line described
        if n_workers < 1:
            raise SolverError(f"--workers must be at least 1, got {n_workers}")
        if staleness < 0:
            raise SolverError(f"staleness must be >= 0 (0 = BSP), got {staleness}")
        self.solver, self.n = solver, int(n_workers)
        self.staleness = int(staleness)
        self._threaded = list(range(1 if self.inline else 0, self.n))  # the workers that are threads
        self.log = log or solver.log
        net = solver.net
        self.data_layers = [(i, layer) for i, layer in enumerate(net.layers) if isinstance(layer, DataLayer)]
        if not self.data_layers:
            raise SolverError(
                f"net '{net.name}' has no data layer: data-parallel training shards the "
                f"batch a data layer reads (Input nets are not supported)"
            )
        self.bounds = {}
        for _, layer in self.data_layers:
            if layer.batch_size < self.n:
                raise SolverError(
                    f"{self.n} workers need a batch of at least {self.n}; layer "
                    f"'{layer.name}' has batch_size {layer.batch_size}"
                )
            self.bounds[layer.name] = shard_bounds(layer.batch_size, self.n)
        first = self.data_layers[0][1]
        self.batch = first.batch_size
        # each worker's share of the global batch: on the host for the losses, and as the
        # backend's array for the gradient reduction (device memory on a GPU backend)
        self.weights = np.array([(hi - lo) / self.batch for lo, hi in self.bounds[first.name]], net.dtype)
        self._dev_weights = net.backend.from_host(self.weights) if net.xp is not np else self.weights
        self.replicas = [
            build_replica(
                solver,
                self.data_layers,
                {l.name: self.bounds[l.name][k][1] - self.bounds[l.name][k][0] for _, l in self.data_layers},
            )
            for k in range(self.n)
        ]
        self.layout = ParamLayout(net)
        self.rep_layouts = [ParamLayout(r) for r in self.replicas]
        for lay in self.rep_layouts:
            if lay.counts != self.layout.counts:
                raise SolverError(
                    f"replica of net '{net.name}' has parameter sizes {lay.counts}, "
                    f"the solver's net {self.layout.counts}"
                )
        self.iter_size = max(1, int(solver.param.iter_size))
        self.n_slots = (self.staleness + 1) * self.iter_size
        self._build_arena(recompute)
        self.blas_threads = blas_threads or max(1, blas.cores() // self.n)
        self._lock = threading.Lock()
        # one lock, two conditions: the workers wait on _cv, the server on _cv_server, so an
        # event wakes only the threads that wait for it
        self._cv = threading.Condition(self._lock)
        self._cv_server = threading.Condition(self._lock)
        self.sharded = False  # the last run's reduce + update ran on the workers (shard.py)
        self._slots = [0] * self.n  # the gradient slot each worker's replica diffs are attached to
        self._affinity = set(blas.allowed_cores())  # where an unpinned worker may run
        self._inputs = [
            {layer.name: [r.blobs[t] for t in layer.param.top] for _, layer in self.data_layers} for r in self.replicas
        ]
        self.timing = {}

    # -- memory ------------------------------------------------------------------------------
    def _build_arena(self, recompute):
        solver, net, P = self.solver, self.solver.net, self.layout.count
        dt = net.dtype
        # plan every net's activations first (each runs once to size its scratch)
        self.plans = [("server net", plan_net(net, params=False, recompute=recompute))]
        self.plans += [
            (f"worker {k}", plan_net(r, params=False, recompute=recompute)) for k, r in enumerate(self.replicas)
        ]
        arena = self.arena = Arena(net.xp)  # device memory on a GPU backend
        off_w = arena.reserve(P * dt.itemsize)
        off_g = arena.reserve(P * dt.itemsize)
        hist = history_buffers(solver)
        off_h = [arena.reserve(b.nbytes) for b in hist]
        off_gk = arena.reserve(self.n * self.n_slots * P * dt.itemsize)
        plan_offsets = [arena.reserve(p.size) for _, p in self.plans]
        arena.allocate()
        self.W = arena.view(off_w, P, dt)
        self.G = arena.view(off_g, P, dt)
        self.grads = arena.view(off_gk, self.n * self.n_slots * P, dt).reshape(self.n, self.n_slots, P)
        self.layout.attach_data(self.W)
        self.layout.attach_diff(self.G)
        for b, off in zip(hist, off_h):
            b.attach(arena.view(off, b.count, b.dtype))
        self.H = [arena.view(off, P, dt) for off in off_h]  # each history buffer, flat
        for k, lay in enumerate(self.rep_layouts):
            lay.attach_data(self.W, copy=False)
            lay.attach_diff(self.grads[k, 0])
        for (_, plan), off in zip(self.plans, plan_offsets):
            plan.attach(arena, off)
        for t in solver.test_nets:
            t.share_with(net)
        self.param_bytes = {
            "params": P * dt.itemsize,
            "param diffs": P * dt.itemsize,
            "solver history": sum(b.nbytes for b in hist),
            "worker gradients": self.grads.nbytes,
        }

    def memory_summary(self):
        """{naive, planned, peak, categories}: naive = N+1 separate nets, each with its own
        parameters, gradients and one allocation per buffer, and the solver's history."""
        from ..memory.report import summarize

        s = summarize(self.plans)
        P = self.param_bytes["params"]
        nets = self.n + 1
        cats = dict(s["categories"])
        cats["params"] = P * nets
        cats["param diffs"] = P * nets
        cats["solver history"] = self.param_bytes["solver history"]
        naive = s["naive"] + 2 * P * nets + self.param_bytes["solver history"]
        fixed = sum(self.param_bytes.values())
        return {
            "naive": naive,
            "planned": self.arena.size,
            "peak": s["peak"] + fixed,
            "unplanned": s["unplanned"],
            "categories": cats,
            "sections": [(label, p.size) for label, p in self.plans],
        }

    # -- the run -------------------------------------------------------------------------------
    def solve(self, resume_file=None, handle_sigint=True):
        """The Solver's ``solve``, with the gradients computed by the workers."""
        if resume_file:
            self.solver.restore(resume_file)
        try:
            with self._running(self.solver.param.max_iter - self.solver.iter, handle_sigint):
                self.solver.solve()
        except _Abandoned as stop:
            self._end_abandoned(stop, final=self.solver.param.snapshot_after_train)
        return self.solver

    def step(self, iters, handle_sigint=False):
        try:
            with self._running(int(iters), handle_sigint):
                self.solver.step(iters)
        except _Abandoned as stop:
            self._end_abandoned(stop, final=False)
        return self.solver

    def _end_abandoned(self, stop, final):
        """After an iteration was abandoned (threads stopped): snapshot the last consistent
        parameters; raise WorkerTimeout for a missed deadline, else (a stop request) return."""
        solver = self.solver
        timed_out = not solver.requested_stop
        for k, name, it in stop.late:
            why = "missed its deadline" if timed_out else "was stopped"
            self.log(
                f"Run {why} while worker {k} ({name}) had not finished iteration {it}: that iteration is abandoned"
            )
        state = None
        if not stop.consistent:
            self.log("The sharded update of that iteration was under way: the parameters are not snapshotted")
        elif timed_out or final:
            state = solver.snapshot()[1]
        if timed_out:
            k, name, it = stop.late[0]
            raise WorkerTimeout(k, it, self.worker_timeout, name, state)
        self.log("Optimization stopped early.")

    def _running(self, iters, handle_sigint):
        trainer = self

        class _Ctx:
            def __enter__(self):
                trainer._install(iters, handle_sigint)

            def __exit__(self, exc_type, exc, tb):
                trainer._uninstall(failed=exc_type is not None)
                return False

        return _Ctx()

    # -- the worker threads' lifetime ------------------------------------------------------------
    def close(self):
        """End the worker threads.  They are started by the first ``step``/``solve`` and parked
        between runs (so that ``step(1)`` in a loop starts and joins no thread); ``close`` wakes
        them, they end, and it joins them (a thread still busy in a computation after 5 s is
        left behind, as after a missed deadline, and named in the log).  Idempotent; ``stats()``
        and ``memory_summary()`` still work afterwards, another run does not.  A trainer is also
        a context manager (``with ParallelTrainer(solver, 2) as t: t.step(100)``), and its
        threads end by themselves when it is garbage collected or the interpreter exits."""
        self._closed = True
        self._discard_pool()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def worker_threads(self):
        """The worker threads alive now (parked between runs, or working)."""
        threads = self._pool.threads if self._pool is not None else []
        return [t for t in threads + self._left_behind if t.is_alive()]

    def _start_pool(self):
        """Start the N worker threads; each waits (parked) for the run it is to join."""
        pool = self._pool = _Pool(self._cv)
        ref = weakref.ref(self)  # parked threads must not keep their trainer alive
        pool.threads = [
            threading.Thread(target=_worker_thread, args=(pool, ref, k), name=f"minicaffe-worker-{k}", daemon=True)
            for k in self._threaded
        ]
        # garbage collection of the trainer, or the interpreter's exit, ends parked threads
        pool.finalizer = weakref.finalize(self, pool.close)
        for t in pool.threads:
            t.start()

    def _discard_pool(self):
        """Stop the workers wherever they are and join them; those still busy after 5 s are
        left behind (daemon threads that end when their computation returns)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with self._cv:
            self._stop = True
            pool.closed = True
            self._cv.notify_all()
            self._cv_server.notify_all()
        pool.finalizer.detach()
        deadline = time.perf_counter() + 5.0  # a worker not hung ends within an iteration or so
        for t in pool.threads:
            if t is not threading.current_thread():
                t.join(timeout=max(0.0, deadline - time.perf_counter()))
        busy = [t for t in pool.threads if t.is_alive()]
        for t in busy:
            self.log(f"{t.name} is still busy: it is left behind and ends when its computation returns")
        self._left_behind += busy

    def _install(self, iters, handle_sigint):
        solver = self.solver
        if self._closed:
            raise SolverError("this ParallelTrainer was closed (its worker threads have ended); build a new one")
        busy = [t.name for t in self._left_behind if t.is_alive()]
        if busy:
            raise SolverError(
                f"{', '.join(busy)} of an earlier run of this trainer is still busy; build a new ParallelTrainer"
            )
        with self._cv:  # workers still inside the last run see it is over before anything is reset
            self._generation += 1
            self._delivered = [-1] * self.n  # the last clock each worker delivered
            self._updated = [-1] * self.n  # the last clock each worker finished its range of the update
            self._limit = max(0, iters) * self.iter_size
            self._iter0 = solver.iter
            self._clock = 0  # the next clock the server reduces
            self._fetched = 0  # batches fetched so far
            self._applied = 0  # clocks whose gradients are in W
            self._batches, self._done, self._losses, self._outputs = {}, {}, {}, {}
            self._positions = {}
            self._error, self._stop = None, False
            self.timing = {
                "server_wait": 0.0,
                "server_reduce": 0.0,
                "server_update": 0.0,
                "server_fetch": 0.0,
                "worker_compute": [0.0] * self.n,
                "worker_wait": [0.0] * self.n,
                "worker_copy": [0.0] * self.n,
                "worker_sync": [0.0] * self.n,
                "worker_update": [0.0] * self.n,
                "clocks": 0,
                "wall": 0.0,
                "staleness": {},  # c - (updates applied when a worker started clock c) -> how often
            }
            self._complete = 0  # clocks whose N gradients are all in
            self._updates, self._rates = {}, {}
        self._t_return = None
        reading = [type(cb).__name__ for cb in solver.callbacks if callable(getattr(cb, "on_gradients_ready", None))]
        self.why_not_sharded = why_not(solver, self.staleness, reading) if self.shard_update else ["shard_update=False"]
        self.sharded = not self.why_not_sharded
        if self.sharded:
            lrs, decays = rates_and_decays(solver)
            plan = self._shard_plans.get((lrs, decays))
            if plan is None:
                plan = self._shard_plans[lrs, decays] = ShardPlan(
                    self.layout.offsets, self.layout.counts, lrs, decays, self.n
                )
            self._shards, self._rule = plan, Rule(solver)
            solver.set_updater(self._sharded_update)
        cores = blas.allowed_cores()  # (a system call: once per run)
        self._pinned = self._cores_to_pin(cores)
        # OpenBLAS's count is set only when it changes: setting it costs 10-40 us, a noticeable
        # part of a run's start and end when a loop calls step(1)
        self._saved_blas = blas.get_threads()
        if self._saved_blas != self.blas_threads:
            blas.set_threads(self.blas_threads)
        # with iter_size 1 every clock writes all of G (the sharded update, or the reduce below),
        # so the Solver need not clear it first: 1.7 MB of LeNet's gradient per step
        solver.set_gradient_source(self._gather, overwrites=self.iter_size == 1)
        solver.add_callback(self)  # on_start: the rate; on_iteration: publish the update, fetch ahead
        for _, layer in self.data_layers:
            layer.set_position_source(self._data_state)
        self._previous_sigint = None
        if (
            handle_sigint
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):

            def on_sigint(signum, frame):
                if solver.requested_stop:
                    raise KeyboardInterrupt
                solver.requested_stop = True
                self.log("Interrupted: stopping after this iteration and writing a snapshot (Ctrl-C again to abort)")

            self._previous_sigint = signal.signal(signal.SIGINT, on_sigint)
        self._t0 = time.perf_counter()
        self._fetch_until(self._lookahead(0))  # first, so that the workers find their batch waiting
        if self._pool is None:
            self._start_pool()
        with self._cv:  # wake the parked workers: this run is theirs
            self._pool.generation = self._generation
            self._cv.notify_all()
        self._saved_affinity = None
        if self.inline and self._pinned:  # this thread is worker 0: its core, until the run ends
            self._saved_affinity = cores
            blas.pin_thread(self._pinned[0])
        mode = "BSP" if not self.staleness else f"SSP, staleness {self.staleness}"
        update = (
            "reduce + update sharded over the workers"
            if self.sharded
            else f"reduce + update on the server ({'; '.join(self.why_not_sharded)})"
        )
        said = (mode, update, self.blas_threads, self._pinned and tuple(self._pinned))
        if said != self._announced:  # once, and again when it changes (step(1) in a loop says it once)
            self._announced = said
            self.log(
                f"Training with {self.n} worker thread(s) ({mode}), "
                f"shards {[hi - lo for lo, hi in self.bounds[self.data_layers[0][1].name]]} of the batch of "
                f"{self.batch}, BLAS threads {self.blas_threads}, {update}"
                + (f", worker k on core {self._pinned}[k]" if self._pinned else "")
            )

    def _cores_to_pin(self, cores):
        """The core of each worker, or None: do not pin (``cores``: those the process may use)."""
        from . import lanes

        if self.pin is False or not cores:
            return None
        fills = len(cores) == self.n and self.blas_threads == 1 and lanes.count() == 1
        if self.pin is None and not fills:
            return None
        return [cores[k % len(cores)] for k in range(self.n)]

    def _lookahead(self, clock):
        """The last clock whose batch should be fetched while the server is at ``clock``: the
        staleness window, plus one more, so that the next batch is read while the workers still
        compute this one (the reader's position in snapshots is that of the solver's next
        batch either way: _data_state)."""
        return clock + self.staleness * self.iter_size + 1

    def _uninstall(self, failed=False):
        """End the run.  When it ended where it was meant to (every fetched batch reduced, every
        update applied, no error) the workers have nothing left to do: each parked by itself
        after the run's last clock, and nobody waits for them.  Otherwise (an error,
        a stop request with batches fetched ahead, an abandoned iteration, Ctrl-C) a worker may
        still be computing: the threads are stopped and joined, and the next run starts new ones."""
        solver = self.solver
        self.timing["wall"] = time.perf_counter() - self._t0
        if self._saved_affinity:  # first: a reader's thread started below must not inherit the pin
            os.sched_setaffinity(0, self._saved_affinity)
        clean = (
            not failed
            and self._error is None
            and not self._stop
            and self._fetched == self._clock
            and (not self.sharded or self._applied == self._clock)
        )
        if not clean:
            self._discard_pool()
        # (clean: each worker parked by itself after the run's last clock, and dropped its trainer)
        if self.sharded:
            solver.set_updater(None)
        solver.set_gradient_source(None)
        solver.remove_callback(self)
        for _, layer in self.data_layers:
            layer.set_position_source(None)
            # batches fetched ahead and not used: rewind the reader to the solver's position
            if self._clock in self._positions and self._fetched > self._clock:
                layer.seek(self._positions[self._clock][layer.name])
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
        if self._saved_blas and self._saved_blas != self.blas_threads:
            blas.set_threads(self._saved_blas)

    def _data_state(self, layer):
        """The reader position a snapshot taken now must record: that of the next batch the
        solver will use, not of the batches already fetched ahead for the workers."""
        clock = (self.solver.iter - self._iter0) * self.iter_size
        pos = self._positions.get(clock)
        return dict(pos[layer.name]) if pos is not None else layer.position()

    # -- the server's side ---------------------------------------------------------------------
    def _fetch_until(self, last):
        """Fetch global batches up to clock ``last`` (not past the run's end)."""
        t0 = time.perf_counter()
        while self._fetched <= last and self._fetched < self._limit:
            c = self._fetched
            self._positions[c] = {layer.name: layer.position() for _, layer in self.data_layers}
            batch = {layer.name: layer.next_batch() for _, layer in self.data_layers}
            with self._cv:
                self._batches[c] = batch
                self._done[c] = 0
                self._losses[c] = [0.0] * self.n
                self._outputs[c] = [None] * self.n
                self._fetched = c + 1
                self._cv.notify_all()  # the workers; the server does not wait for batches
            self._positions.pop(c - 2 * self.n_slots - 2, None)
        self.timing["server_fetch"] += time.perf_counter() - t0

    def _gather(self):
        """Stands in for ``net.forward_backward()`` in the Solver's loop: one global batch."""
        c = self._clock
        if c >= self._limit:  # the workers park after the run's last clock: none would compute it
            raise SolverError(
                f"the solver asked for batch {c + 1} of a run of {self._limit} (its iterations x iter_size)"
            )
        self._fetch_until(self._lookahead(c))
        t0 = time.perf_counter()
        if self.inline:  # this thread is worker 0: its shard first, then its range of the update
            gen, tm = self._generation, self.timing
            tm["staleness"][0] = tm["staleness"].get(0, 0) + 1  # (BSP: it computes from the latest W)
            self._as_worker0(c, self._compute, 0, c, gen, tm, self._batches[c], t0)
            if self.sharded:
                t_sync = time.perf_counter()
                self._wait_for(c, t0, lambda: self._done[c] == self.n)
                if self._complete > c:  # (else a non-finite loss: reported below, nothing updated)
                    self._as_worker0(c, self._apply_shard, 0, c, gen, tm, t_sync)
        self._wait_for(c, t0, lambda: self._gathered(c))
        with self._cv_server:
            losses, outputs = self._losses.pop(c), self._outputs.pop(c)
            del self._done[c], self._batches[c]
        t1 = time.perf_counter()
        if not np.isfinite(losses).all():
            self._nonfinite(c, losses)
        G, parts = self.G, self.grads[:, c % self.n_slots]
        if self.sharded:
            pass  # the workers wrote the reduced gradient into G as they updated (_sharded_update)
        elif self.iter_size == 1:
            # the gradient source overwrites G (the Solver did not clear it: set_gradient_source);
            # one gemv over the flat gradients; on the CPU np.dot, not @ (numpy's matmul was seen
            # running BLAS holding the GIL; dot releases it: kernels/gemm.py gemm_blas)
            if self.n == 1:
                G[...] = parts[0]
            elif self.solver.net.xp is np:
                np.dot(self._dev_weights, parts, out=G)
            else:
                G[...] = self._dev_weights @ parts
        elif self.n == 1:  # iter_size batches add up in G (the Solver cleared it)
            G += parts[0]
        elif self.solver.net.xp is np:
            G += np.dot(self._dev_weights, parts)
        else:
            G += self._dev_weights @ parts
        loss = float(np.dot(self.weights, losses))
        for name in outputs[0]:
            self.solver.net.blobs[name].data[...] = sum(w * o[name] for w, o in zip(self.weights, outputs))
        t2 = time.perf_counter()
        self.timing["server_wait"] += t1 - t0
        self.timing["server_reduce"] += t2 - t1
        self._clock = c + 1
        self._t_return = t2
        return loss

    def _wait_for(self, c, t0, ready):
        """The server waits (the lock is not held) until ``ready()`` holds for clock ``c``, a
        worker fails (WorkerError), or the iteration is abandoned: a stop request not met
        within STOP_GRACE, or a worker past its deadline counted from ``t0``."""
        stop_seen = None
        with self._cv_server:
            while not ready() and self._error is None:
                now = time.perf_counter()
                if self.solver.requested_stop and stop_seen is None:
                    stop_seen = now
                if (stop_seen is not None and now - stop_seen > STOP_GRACE) or (
                    self.worker_timeout is not None and now - t0 > self.worker_timeout
                ):
                    self._abandon(c)
                self._cv_server.wait(0.2)
            if self._error is not None:
                k, kc, exc = self._error
                raise WorkerError(k, self._iter0 + kc // self.iter_size, exc) from exc

    def _as_worker0(self, c, fn, *args):
        """``fn(*args)``, worker 0's part of clock ``c`` run in the server's own thread
        (``inline``): its failure is a WorkerError at once, and the worker threads stop."""
        try:
            fn(*args)
        except Exception as exc:
            with self._cv:
                if self._error is None:
                    self._error = (0, c, exc)
                self._cv.notify_all()
            raise WorkerError(0, self._iter0 + c // self.iter_size, exc) from exc

    def _gathered(self, c):
        """Clock ``c`` is ready for the server (the lock is held): its N gradients are in and,
        with the sharded update, so is the update (the server then waits once per clock, and
        the workers wake it once), unless a non-finite loss stopped the workers before it."""
        if self._done.get(c, 0) < self.n:
            return False
        return not self.sharded or self._applied > c or self._complete <= c

    def _thread_name(self, k):
        """The name of the thread that computes worker ``k``."""
        return threading.current_thread().name if self.inline and k == 0 else f"minicaffe-worker-{k}"

    def _abandon(self, c):
        """Leave clock ``c``: rewind to the start of its iteration (the reader is rewound there
        when the threads stop) and unwind the Solver's loop before it updates anything."""
        it = self._iter0 + c // self.iter_size
        self._stop = True  # (the lock is held) no worker may start the sharded update of c now
        if self.sharded and self._complete > c:
            # every gradient of c is in, so its update is under way: W is partly updated
            late = [(k, self._thread_name(k), it) for k in range(self.n) if self._updated[k] < c]
            raise _Abandoned(late[:1], consistent=False)
        late = [(k, self._thread_name(k), it) for k in range(self.n) if self._delivered[k] < c]
        self._clock = (c // self.iter_size) * self.iter_size
        raise _Abandoned(late)

    def on_start(self, solver):
        """A solver callback, each iteration before its gradients: with the sharded update,
        publish this iteration's learning rate, which lets the workers update W as soon as all
        gradients are in.  It comes after the iteration's test (the Solver does not clear the
        diffs: the workers overwrite G), so the workers never write W or G while the server
        reads them."""
        if not self.sharded:
            return
        rate = solver.learning_rate()
        with self._cv:
            self._rates[self._clock] = (rate, Rule.correction(solver))
            self._cv.notify_all()

    def _sharded_update(self, solver, rate):
        """The Solver's updater while the workers update: wait until every shard of this
        clock's update is in W (shard.py does the arithmetic of the Solver's rule)."""
        c = self._clock - 1
        t0 = time.perf_counter()
        with self._cv_server:
            published = self._rates.get(c, (None,))[0]
            if published != rate:
                raise SolverError(
                    f"iteration {solver.iter}: the learning rate changed between the start of the iteration "
                    f"({published}) and its update ({rate}); the sharded update needs it fixed"
                )
            while self._applied <= c and self._error is None:
                if self.worker_timeout is not None and time.perf_counter() - t0 > self.worker_timeout:
                    it = self._iter0 + c
                    late = [(k, self._thread_name(k), it) for k in range(self.n) if self._updated[k] < c]
                    self._stop = True
                    raise _Abandoned(late[:1], consistent=False)
                self._cv_server.wait(0.2)
            if self._error is not None:
                k, kc, exc = self._error
                raise WorkerError(k, self._iter0 + kc, exc) from exc
            del self._rates[c]

    def _nonfinite(self, c, losses):
        from ..checks import explain_nonfinite

        it = self._iter0 + c // self.iter_size
        k = next(i for i, v in enumerate(losses) if not np.isfinite(v))
        lo, hi = self.bounds[self.data_layers[0][1].name][k]
        raise SolverError(
            f"loss is {losses[k]} at iteration {it}, from worker {k} (images {lo}..{hi - 1} of the batch): "
            f"in its replica, {explain_nonfinite(self.replicas[k])}"
        )

    def on_iteration(self, solver, loss, lr):
        """A solver callback: after the Solver applied the update, publish it and fetch ahead."""
        now = time.perf_counter()
        if self._t_return is not None:
            self.timing["server_update"] += now - self._t_return
        with self._cv:
            if not self.sharded:  # (sharded: the workers set it)
                self._applied = self._clock
                self._cv.notify_all()
            self.timing["clocks"] = self._clock
        self._fetch_until(self._lookahead(self._clock))

    # -- the workers ---------------------------------------------------------------------------
    def _ready(self, c):
        need = (c // self.iter_size - self.staleness) * self.iter_size
        return c in self._batches and self._applied >= need

    def _run_worker(self, k, generation, core):
        """Worker ``k``'s part of run ``generation``: its clocks 0, 1, ... until the run is over.
        ``core``: where the thread is bound now (None: not bound).  Returns (True, core) when the
        run is over (the thread parks), (False, core) after an error (handed to the server; the
        thread ends)."""
        want = self._pinned[k] if self._pinned else None
        if want != core:
            if want is not None:
                blas.pin_thread(want)
            elif self._affinity:
                os.sched_setaffinity(0, self._affinity)  # a later run without pinning
            core = want
        cv = self._cv
        with cv:
            if generation != self._generation:
                return True, core
            tm, sharded = self.timing, self.sharded
        lag = tm["staleness"]
        c = 0
        try:
            while True:
                if c >= self._limit:
                    return True, core  # the run's last clock is done: park (nobody needs to wake us)
                t0 = time.perf_counter()
                with cv:
                    while not (
                        self._stop or self._error is not None or generation != self._generation or self._ready(c)
                    ):
                        cv.wait(0.5)
                    if self._stop or self._error is not None or generation != self._generation:
                        return True, core
                    batch = self._batches[c]
                    lag[c - self._applied] = lag.get(c - self._applied, 0) + 1
                if not self._compute(k, c, generation, tm, batch, t0):
                    return True, core  # a thread left behind by an abandoned run: deliver nothing
                if sharded and not self._update_shard(k, c, generation, tm):
                    return True, core
                c += 1
        except BaseException as exc:  # noqa: BLE001  (handed to the server)
            with cv:
                if self._error is None and generation == self._generation:
                    self._error = (k, c, exc)
                cv.notify_all()
                self._cv_server.notify_all()
            return False, core

    def _compute(self, k, c, generation, tm, batch, t0):
        """Worker ``k``'s forward and backward of clock ``c`` on its rows of ``batch`` (waiting
        for it began at ``t0``), delivered to the server; False: the run it was for is over
        (it delivers nothing)."""
        t1 = time.perf_counter()
        net, grads, slot = self.replicas[k], self.grads[k], self._slots[k]
        if self.n_slots > 1 and c % self.n_slots != slot:
            slot = self._slots[k] = c % self.n_slots
            self.rep_layouts[k].attach_diff(grads[slot])  # (zeroed)
        else:
            grads[slot][...] = 0
        for name, blobs in self._inputs[k].items():
            lo, hi = self.bounds[name][k]
            for blob, arr in zip(blobs, batch[name]):
                blob.data[...] = arr[lo:hi].reshape(blob.shape)
        t2 = time.perf_counter()
        loss = net.forward_backward()
        outs = {name: np.array(net.blobs[name].data) for name in net.outputs}
        t3 = time.perf_counter()
        with self._cv:
            if generation != self._generation or c not in self._done:
                return False
            self._losses[c][k] = loss
            self._outputs[c][k] = outs
            self._done[c] += 1
            self._delivered[k] = c
            tm["worker_wait"][k] += t1 - t0
            tm["worker_copy"][k] += t2 - t1
            tm["worker_compute"][k] += t3 - t2
            if self._done[c] == self.n:
                # a non-finite loss is the server's to report (_nonfinite): nothing of
                # that clock may reach W, so the workers are not let through
                if all(math.isfinite(x) for x in self._losses[c]):
                    self._complete = c + 1
                if not self.sharded or self._complete <= c or self.inline:
                    # (sharded: woken once the update is in, unless it computes worker 0's range)
                    self._cv_server.notify_all()
            if self.sharded:
                self._cv.notify_all()  # a worker waiting for every gradient of c
        return True

    def _update_shard(self, k, c, generation, tm):
        """Worker ``k``'s part of clock ``c``'s update (shard.py), once all N gradients and
        the iteration's rate are in; the last worker to finish publishes W.  False: stop."""
        t0 = time.perf_counter()
        with self._cv:
            while not (
                self._stop
                or self._error is not None
                or generation != self._generation
                or (self._complete > c and c in self._rates)
            ):
                self._cv.wait(0.5)
            if self._stop or self._error is not None or generation != self._generation:
                return False
        return self._apply_shard(k, c, generation, tm, t0)

    def _apply_shard(self, k, c, generation, tm, t0):
        """Worker ``k`` sums the N gradients of clock ``c`` and updates W on its range (they
        and the rate are in; waiting for them began at ``t0``); False: the run is over."""
        t1 = time.perf_counter()
        rate, correction = self._rates[c]
        self._shards.run(k, self.grads[:, 0], self.weights, self.W, self.G, self.H, self._rule, rate, correction)
        t2 = time.perf_counter()
        with self._cv:
            if generation != self._generation:
                return False
            self._updates[c] = self._updates.get(c, 0) + 1
            self._updated[k] = c
            tm["worker_sync"][k] += t1 - t0
            tm["worker_update"][k] += t2 - t1
            if self._updates[c] == self.n:
                del self._updates[c]
                self._applied = c + 1
                self._cv.notify_all()
                self._cv_server.notify_all()
        return True

    # -- reporting -----------------------------------------------------------------------------
    def stats(self):
        """Seconds per clock: server (fetch, wait, reduce, update; with the sharded update its wait
        includes the workers' update) and each worker's compute/wait;
        ``staleness``: {c - updates applied when a worker started clock c: count}, in clocks
        (at most (s + 1) * iter_size - 1; all 0 under BSP with iter_size 1)."""
        t = self.timing
        n = max(t.get("clocks", 0), 1)
        return {
            "clocks": t.get("clocks", 0),
            "wall_per_clock": t.get("wall", 0.0) / n,
            "server_fetch": t["server_fetch"] / n,
            "server_wait": t["server_wait"] / n,
            "server_reduce": t["server_reduce"] / n,
            "server_update": t["server_update"] / n,
            "worker_compute": [x / n for x in t["worker_compute"]],
            "worker_wait": [x / n for x in t["worker_wait"]],
            "worker_copy": [x / n for x in t["worker_copy"]],
            "worker_sync": [x / n for x in t["worker_sync"]],
            "worker_update": [x / n for x in t["worker_update"]],
            "staleness": dict(sorted(t["staleness"].items())),
        }


class _Pool:
    """A trainer's N worker threads and what they wait for while parked: ``generation``, the
    run they are to join next (set by the server when a run starts), or ``closed``."""

    def __init__(self, cv):
        self.cv = cv  # the trainer's workers' condition (its lock guards the fields here too)
        self.generation = 0
        self.closed = False
        self.threads = []
        self.finalizer = None

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()


def _worker_thread(pool, trainer_ref, k):
    """A worker thread's life: parked until a run starts, that run's clocks, parked again; it
    ends when the pool is closed (``close``, an error, garbage collection, interpreter exit).
    While parked it holds only a weak reference to its trainer."""
    seen, core = 0, None
    while True:
        with pool.cv:
            while pool.generation == seen and not pool.closed:
                pool.cv.wait()
            if pool.closed:
                return
            seen = pool.generation
        trainer = trainer_ref()
        if trainer is None:
            return
        keep, core = trainer._run_worker(k, seen, core)
        del trainer
        if not keep:
            return


def train_with_workers(solver, n_workers, staleness=0, resume_file=None, **kwargs):
    """What ``python -m minicaffe.train ... --workers N`` calls instead of ``solver.solve()``:
    train with N worker threads and this thread as the parameter server; returns the trainer
    (``trainer.stats()``, ``trainer.memory_summary()``)."""
    with ParallelTrainer(solver, n_workers, staleness=staleness, **kwargs) as trainer:
        trainer.solve(resume_file)
    return trainer
