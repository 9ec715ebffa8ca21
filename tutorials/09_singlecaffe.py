# %% [markdown]
# # Lesson 9: SingleCaffe, a parameter server and N worker threads
#
# **You will learn** how data-parallel training works inside one machine: one parameter-server
# thread owns the weights and the solver, N worker threads each compute the gradient of their
# share of the batch; what bulk-synchronous (BSP) and stale-synchronous (SSP) training trade;
# where the time of a step goes; and why threads in Python only help when the kernels release
# the GIL. **You need** lesson 7 (solvers) and lesson 8 (the arena the replicas share).
#
# SingleCaffe (IEEE Access, 2018) runs Caffe's training with one server thread and N worker
# threads in one process, all sharing one planned memory arena. Each iteration (a *clock*) the
# batch is cut into N shards; worker k runs forward and backward of its replica on shard k; the
# server sums the N gradients, weighted by shard size, and applies the solver's update.

# %%
import os
import sys
import threading
import time

import matplotlib.pyplot as plt
import numpy as np
from _course import QUICK, ROOT, cleanup, show

from minicaffe.parallel import ParallelTrainer, synthetic_solver

print("quick mode" if QUICK else "full mode", "| cores:", os.cpu_count())

# %% [markdown]
# ## A parameter server in forty lines
# Linear regression `y = X w` with two workers, written out: the server waits for both
# gradients of clock c, averages them, updates w and publishes `applied = c + 1`. A worker may
# start clock c once `applied >= c - s`: with staleness `s = 0` (BSP) it waits for the previous
# update; with `s > 0` (SSP) it may run up to s clocks ahead on older weights. A sleep stands for
# each worker's compute, and at every clock one worker, drawn at random, is a *straggler*
# (five times slower: a busy core, a page fault, a slow batch). Every wait and compute is timed.


# %%
def toy_ps(staleness, clocks=10, fast=0.005, slow=0.025):
    rng = np.random.default_rng(0)
    straggler = rng.integers(0, 2, clocks)  # which worker is slow at each clock (the same for every run)
    X = rng.standard_normal((64, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0])
    shards = [(X[:32], y[:32]), (X[32:], y[32:])]
    w = np.zeros(4)
    grads, applied, events = {}, [0], []
    cv = threading.Condition()
    t0 = time.perf_counter()

    def worker(k):
        for c in range(clocks):
            t = time.perf_counter()
            with cv:
                cv.wait_for(lambda: applied[0] >= c - staleness)
                w_seen = w.copy()
            events.append((f"worker {k}", "wait", t - t0, time.perf_counter() - t0))
            t = time.perf_counter()
            Xk, yk = shards[k]
            g = Xk.T @ (Xk @ w_seen - yk) / len(yk)
            time.sleep(slow if straggler[c] == k else fast)  # the forward/backward of a real net
            events.append((f"worker {k}", "compute", t - t0, time.perf_counter() - t0))
            with cv:
                grads[(c, k)] = g
                cv.notify_all()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for c in range(clocks):  # the server
        t = time.perf_counter()
        with cv:
            cv.wait_for(lambda: (c, 0) in grads and (c, 1) in grads)
        events.append(("server", "wait", t - t0, time.perf_counter() - t0))
        t = time.perf_counter()
        w -= 0.3 * (grads.pop((c, 0)) + grads.pop((c, 1))) / 2
        with cv:
            applied[0] = c + 1
            cv.notify_all()
        events.append(("server", "update", t - t0, time.perf_counter() - t0))
    for th in threads:
        th.join()
    return w, events, time.perf_counter() - t0


runs = {s: toy_ps(s) for s in (0, 2)}
for s, (w, _, wall) in runs.items():
    print(f"staleness {s} ({'BSP' if s == 0 else 'SSP'}): w = {np.round(w, 3)}, {wall * 1e3:.0f} ms for 10 clocks")

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), sharex=True)
colors = {"compute": "C0", "wait": "0.85", "update": "C3"}
for ax, (s, (_, events, wall)) in zip(axes, runs.items()):
    rows = ["server", "worker 0", "worker 1"]
    for who, what, a, b in events:
        ax.barh(rows.index(who), b - a, left=a, color=colors[what], edgecolor="w", lw=0.3)
    ax.set_yticks(range(3), rows)
    ax.set_title(f"staleness {s} ({'BSP' if s == 0 else 'SSP'}): {wall * 1e3:.0f} ms", fontsize=9)
axes[1].set_xlabel("seconds")
axes[0].legend(
    handles=[plt.Rectangle((0, 0), 1, 1, fc=c) for c in colors.values()], labels=list(colors), fontsize=7, ncol=3
)
fig.tight_layout()
show(fig, "09_toy_timeline")
waits = {
    s: sum(b - a for who, what, a, b in ev if who.startswith("worker") and what == "wait")
    for s, (_, ev, _) in runs.items()
}
print(f"workers' total waiting: BSP {waits[0] * 1e3:.0f} ms, SSP {waits[2] * 1e3:.0f} ms")
assert waits[2] < waits[0], "SSP should let the fast worker run ahead instead of waiting"

# %% [markdown]
# In BSP, at every clock the worker that happened to be fast waits for the straggler (grey): each
# clock costs the slower of the two, so the run pays for every straggler. With staleness 2 a
# worker that is ahead keeps going on weights up to two updates old, and a straggler at one
# clock is made up by fast clocks later: the run pays roughly for the slower worker's *total*.
# The server still applies one update per clock from both gradients, in clock order; both runs
# head to the same solution (the final `w` above), SSP along a slightly different path.
#
# ## The GIL, and why the kernels release it
# CPython runs Python bytecode in one thread at a time (the global interpreter lock). Two
# threads of pure-Python arithmetic take as long as one doing both halves; threads only run in
# parallel while the GIL is released. numpy's BLAS calls release it, and every numba kernel in
# `kernels/` is compiled with `nogil=True`. We time the same total work in one thread and split
# over two, for a Python loop and for a numba kernel.

# %%
from numba import njit


def py_work(n):
    s = 0.0
    for i in range(n):
        s += i * 0.5
    return s


@njit(nogil=True, cache=False)
def nb_work(n):
    s = 0.0
    for i in range(n):
        s += np.sin(i * 0.5)
    return s


def threaded(fn, n, k):
    """(wall seconds, cores busy = CPU seconds of this process / wall seconds)."""
    ths = [threading.Thread(target=fn, args=(n // k,)) for _ in range(k)]
    t, c = time.perf_counter(), time.process_time()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t
    return wall, (time.process_time() - c) / wall


nb_work(10)
n_py, n_nb = (1_500_000, 4_000_000) if QUICK else (4_000_000, 40_000_000)
speedup, busy = {}, {}
for label, fn, n in (("pure Python loop", py_work, n_py), ("numba, nogil=True", nb_work, n_nb)):
    one = min(threaded(fn, n, 1) for _ in range(5))  # the best of 5: the run least disturbed
    two = min(threaded(fn, n, 2) for _ in range(5))
    speedup[label], busy[label] = one[0] / two[0], two[1]
    print(
        f"  {label:18s} 1 thread {one[0] * 1e3:7.1f} ms, 2 threads {two[0] * 1e3:7.1f} ms: "
        f"{one[0] / two[0]:.2f}x, {two[1]:.2f} cores busy"
    )
gil = getattr(sys, "_is_gil_enabled", lambda: True)()
if gil:
    # wall-clock ratios move with whatever else the machine runs; the CPU time the two threads
    # got does not exceed one core while they need the GIL, however busy the machine is
    assert busy["pure Python loop"] < 1.3, "with the GIL, Python threads cannot run bytecode at once"
print("(on a machine busy with other work, the numba threads gain less than 2x: the cores are shared)")

fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(speedup), list(speedup.values()), color=["C3", "C2"])
ax.axvline(1, color="k", lw=0.8)
ax.axvline(2, color="k", lw=0.8, ls="--")
ax.set_xlabel("speedup of 2 threads over 1 (dashed: perfect)")
ax.set_title("the GIL: measured on this machine")
show(fig, "09_gil")

# %% [markdown]
# ## The real runtime: LeNet with N workers
# `minicaffe.parallel.ParallelTrainer(solver, n_workers, staleness)` does the above for a real
# solver: the replicas' parameters are views of one flat vector W in the arena, each worker writes
# its own gradient vector, and the server runs the solver's own update. (The data here are
# synthetic, with LeNet's shapes.) First a claim that must hold: **BSP with 2 workers computes
# what 1 worker computes** on the whole batch, up to the order of float32 sums. Those rounding
# differences (a few units in the 7th digit) are amplified a little by every update, so over
# many iterations the two runs drift apart slowly, as two runs on different BLAS builds would.


# %%
class Losses:
    """A solver callback (``solver.add_callback``): records each iteration's loss."""

    def __init__(self):
        self.values = []

    def on_iteration(self, solver, loss, lr):
        self.values.append(float(loss))


def lenet_solver(batch):
    """Caffe's LeNet solver on synthetic MNIST-shaped data (no download), ``batch`` images a
    batch, no tests, seeded: two solvers made alike start from the same weights."""
    return synthetic_solver(os.path.join(ROOT, "nets", "lenet_solver.prototxt"), batch, random_seed=1)


def run(workers, staleness, iters, batch):
    solver = lenet_solver(batch)
    rec = Losses()
    solver.add_callback(rec)
    trainer = ParallelTrainer(solver, workers, staleness=staleness, log=lambda m: None)
    t = time.perf_counter()
    trainer.step(iters)
    return rec.values, trainer, time.perf_counter() - t


batch, iters = (16, 6) if QUICK else (64, 60)
one, _, _ = run(1, 0, iters, batch)
two, trainer2, _ = run(2, 0, iters, batch)
print("1 worker :", np.round(one[:6], 5), "...")
print("2 workers:", np.round(two[:6], 5), "...")
drift = np.abs(np.array(one) - np.array(two)) / np.abs(one)
print(f"largest relative difference: first 6 iterations {drift[:6].max():.1e}, all {len(one)} {drift.max():.1e}")
assert np.allclose(one[:6], two[:6], rtol=1e-5, atol=1e-6), "BSP with 2 workers must compute what 1 worker does"
assert drift.max() < 1e-2

# %% [markdown]
# ## Where the time goes
# `trainer.stats()` splits each clock: the server fetches the next batch, waits for the workers,
# reduces the gradients and updates; each worker copies its shard in, computes, and waits. BSP
# and SSP (staleness 2) with 2 workers:

# %%
ssp, trainer_ssp, _ = run(2, 2, iters, batch)
parts = {}
for label, tr in (("BSP", trainer2), ("SSP s=2", trainer_ssp)):
    st = tr.stats()
    parts[label] = st
    print(
        f"{label}: {st['wall_per_clock'] * 1e3:.1f} ms per clock; server wait {st['server_wait'] * 1e3:.1f}, reduce {st['server_reduce'] * 1e3:.2f}, update {st['server_update'] * 1e3:.2f} ms; workers compute {np.round(np.array(st['worker_compute']) * 1e3, 1)} wait {np.round(np.array(st['worker_wait']) * 1e3, 1)} ms"
    )

fig, ax = plt.subplots(figsize=(9, 3.2))
rows, y = [], 0
seg_colors = {"fetch": "C4", "wait": "0.8", "reduce": "C1", "update": "C3", "copy": "C5", "compute": "C0"}
for label, st in parts.items():
    bars = [("server", {k: st[f"server_{k}"] for k in ("fetch", "wait", "reduce", "update")})]
    bars += [
        (
            f"worker {k}",
            {"copy": st["worker_copy"][k], "compute": st["worker_compute"][k], "wait": st["worker_wait"][k]},
        )
        for k in range(2)
    ]
    for who, segs in bars:
        left = 0.0
        for seg, v in segs.items():
            ax.barh(y, v * 1e3, left=left, color=seg_colors[seg])
            left += v * 1e3
        rows.append(f"{label}: {who}")
        y += 1
ax.set_yticks(range(len(rows)), rows, fontsize=8)
ax.invert_yaxis()
ax.set_xlabel("ms per clock")
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, fc=c) for c in seg_colors.values()],
    labels=list(seg_colors),
    fontsize=7,
    ncol=6,
)
ax.set_title(f"LeNet, batch {batch}, 2 workers: where a clock's time goes (measured)")
show(fig, "09_where_time_goes")

# %% [markdown]
# The memory of the whole run is one arena: W once, the summed gradient, the solver's history,
# one gradient slot per worker and clock of staleness, and every replica's planned activations.

# %%
mem = trainer2.memory_summary()
print(
    f"arena {mem['planned'] / 2**20:.2f} MiB vs {mem['naive'] / 2**20:.2f} MiB for 3 separate nets ({mem['planned'] / mem['naive']:.2f}x)"
)
assert mem["planned"] < mem["naive"]

# %% [markdown]
# ## What two cores share
# Half the batch on each of two cores would make a step twice as fast if the two cores were
# independent. They are separate cores, each with its own L1 and L2 caches, but they share the
# last-level cache (L3) and the memory behind it; in a virtual machine they also share them with
# whatever else the host runs. A LeNet step moves megabytes through that cache: every
# activation, every gradient, the weights, read and written each iteration. So a core slows down
# when the other core moves a lot of memory, and hardly at all when the other core only computes.
#
# We time worker 0's replica (its share of the batch) alone on one core, then while a process on
# the other core (a) multiplies two small matrices again and again (SGEMM: all of it fits in
# that core's own L2), (b) copies an 8 MiB buffer again and again (all of it goes through the
# L3), (c) trains worker 1's replica, the neighbour a real step has. A process shares nothing
# with ours but the machine. Last, (d) worker 1's replica runs in a *thread* of this process, as
# SingleCaffe runs it: then the two replicas also share the GIL. Each time is the best of a few
# rounds, the run least disturbed by the rest of the machine.

# %%
import multiprocessing

from minicaffe.parallel import blas, lanes

cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
rows_per_worker = trainer2.replicas[0].blobs["data"].shape[0]
KINDS = ["SGEMM, a process", "copy 8 MiB, a process", "worker 1, a process", "worker 1, a thread"]


def step_time(net, steps):
    t = time.perf_counter()
    for _ in range(steps):
        net.forward_backward()
    return (time.perf_counter() - t) / steps


def neighbour_loop(kind, stop, count):
    """The other core's work until ``stop`` is set; ``count.value`` counts its rounds."""
    os.sched_setaffinity(0, {cores[1]})
    if kind.startswith("SGEMM"):
        a = np.random.default_rng(0).random((192, 192), dtype=np.float32)
        work = lambda: np.dot(a, a)  # noqa: E731
    elif kind.startswith("copy"):
        src = np.ones(2 * 2**20, np.float32)
        dst = np.empty_like(src)
        work = lambda: np.copyto(dst, src)  # noqa: E731
    else:
        work = trainer2.replicas[1].forward_backward
    while not stop.is_set():
        work()
        count.value += 1


def next_to(kind, steps):
    """Worker 0's step on this core while the other runs ``kind`` (None: nothing); the
    neighbour's count of rounds."""
    if kind is None:
        return step_time(trainer2.replicas[0], steps), None
    ctx = multiprocessing.get_context("fork")  # the child starts with this process's nets
    stop, count = ctx.Event(), ctx.RawValue("l", 0)
    if kind.endswith("thread"):
        other = threading.Thread(target=neighbour_loop, args=(kind, stop, count))
    else:
        other = ctx.Process(target=neighbour_loop, args=(kind, stop, count))
    other.start()
    try:
        while count.value == 0:  # the neighbour is at work before the clock starts
            time.sleep(0.001)
        return step_time(trainer2.replicas[0], steps), count.value
    finally:
        stop.set()
        other.join()


if len(cores) >= 2:
    # one thread per replica, as in the runtime: no lanes, one BLAS thread (else the step's
    # own helper threads would want the other core too)
    here, lanes_before, blas_before = os.sched_getaffinity(0), lanes.set_count(1), blas.get_threads()
    blas.set_threads(1)
    os.sched_setaffinity(0, {cores[0]})
    steps, rounds = (20, 3) if QUICK else (100, 5)
    step_time(trainer2.replicas[0], 5)
    best = {kind: float("inf") for kind in [None] + KINDS}
    for _ in range(rounds):
        for kind in best:
            t, count = next_to(kind, steps)
            best[kind] = min(best[kind], t)
            assert kind is None or count > 0, f"the neighbour ({kind}) never ran"
    os.sched_setaffinity(0, here)
    lanes.set_count(lanes_before)
    if blas_before:
        blas.set_threads(blas_before)
    alone = best[None]
    print(f"worker 0's step ({rows_per_worker} images) alone on core {cores[0]}: {alone * 1e3:.2f} ms")
    for kind in KINDS:
        print(f"  next to {kind:22s} {best[kind] * 1e3:7.2f} ms  ({best[kind] / alone:.2f}x alone)")

    fig, ax = plt.subplots(figsize=(6.5, 2.4))
    ax.barh(KINDS, [100 * (best[k] / alone - 1) for k in KINDS], color=["C2", "C3", "C0", "C1"])
    ax.axvline(0, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(f"worker 0's step: % longer than alone ({alone * 1e3:.2f} ms)")
    ax.set_title("what the other core's work costs this one (measured)")
    show(fig, "09_neighbours")
else:
    print("one core available: the neighbours need a second one (skipped)")

# %% [markdown]
# Read the first three bars against each other: the copying process costs a step more than the
# computing one, because the step's data and the neighbour's buffer compete for the same shared
# cache; worker 1's replica in a process computes and streams its own activations, so it sits
# between them. The last bar adds what threads share: the GIL. Each replica holds it for its
# Python between two kernels, and a thread leaving a kernel waits while the other holds it. How
# much that adds depends on how much of the step is Python (compare the quick mode's bars with
# the full mode's, four times the images per worker); a few percent between the last two bars is
# within what the machine's own noise moves from one run to the next, so rerun before you read
# anything into it.
# `python benchmarks/parallel_floor.py` measures all of it for LeNet at its real batch, and
# `docs/PARALLEL.md` ("What two cores of this machine allow") has the figures of the machine
# this course was written on.

# %% [markdown]
# ## Exercises
# 1. Write `may_start(clock, applied, staleness)`, the rule a worker checks before clock `clock`,
#    and `shard_bounds(batch, n)`, the `(lo, hi)` rows of each of n workers (sizes differing by
#    at most one, larger shards first). Check: `python -m tutorials.check 09.1`
# 2. Write `reduce_gradients(grads, sizes)`: the server's sum of the workers' gradient vectors,
#    each weighted by its shard's share of the batch. Check: `python -m tutorials.check 09.2`
# 3. (thought) Why does BSP with N workers compute the same update as one worker on the whole
#    batch, while SSP does not? What does SSP buy, and when is it worth it?
# 4. (thought) Two processes that share nothing but the machine run two LeNet replicas in step
#    faster than two threads of one process do. What do the two threads share that the
#    processes do not? Why does a net whose step is long and bound by arithmetic (CIFAR-10
#    quick) get closer to 2x from two workers than LeNet does?
#
# Answers to the thought questions: `tutorials/solutions/ANSWERS.md`.

# %%
cleanup()
print("lesson 9 done")
