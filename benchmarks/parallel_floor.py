"""What two threads (and two processes) can do at best on this machine, with no runtime: the floor
under ``--workers 2``.

    python benchmarks/parallel_floor.py                     # LeNet, 5 rounds of 200 steps
    python benchmarks/parallel_floor.py --rounds 7 --steps 300
    python benchmarks/parallel_floor.py --no-processes --no-neighbours  # the threads' rows only

Two workers each run the training net's forward and backward on half the batch.  Before any
runtime cost (no gradients reduced, no update, no batch fetched), two threads doing only that
already take longer than one thread does on half the batch: they share the memory system, and
each hands the GIL to the other between its kernels.  This script measures that, in one process
and two forked from it (one lane, OpenBLAS 1 thread), on the nets ``benchmarks/parallel_ratio.py``
trains (LeNet on MNIST: the solver's net, which reads its batch through its Data layer, and the
two replicas of a ``ParallelTrainer``, Input layers holding a batch's rows), alternating in each
round:

* ``one thread, batch B``: the solver's net, ``net.forward_backward()`` in a loop;
* ``one thread, batch B/2``: worker 0's replica, alone on the machine;
* ``two threads, free``: the two replicas, one per thread, each bound to its own core, each
  looping on its own;
* ``two threads, in step``: the same, meeting at a ``threading.Barrier`` before every step, as
  BSP's workers meet at every clock;
* ``two processes, free`` / ``in step`` (``--processes``, on by default): the same two replicas in
  two processes forked from this one, each bound to its core, meeting at a
  ``multiprocessing.Barrier`` before every step or not.  They share no GIL, no arena, no cache
  line: only the machine (its caches, its memory bandwidth, the hypervisor's cores).  What the
  two threads lose beyond what the two processes lose is the GIL's and the process's; what the
  processes lose against one alone is the machine's;
* ``half batch, next to <load>`` (``--neighbours``, on by default): worker 0's replica alone on
  core 0 while a process on core 1 runs a compute-only loop (``fma``: registers only), OpenBLAS
  SGEMM on 256x256 matrices (``sgemm``: its working set in core 1's L2) or copies a buffer of
  ``--stream-mb`` MiB again and again (``stream``: L3 and memory traffic), so that the table says
  which kind of neighbour slows a step down;
* whole steps (``--no-steps`` to skip), the update included: ``one thread, a solver step`` (the
  solver's ``step``: its reader, its loop, its update), ``--workers 2, a runtime step`` (a
  ``ParallelTrainer``'s ``step``, the threaded runtime) and ``two processes, a BSP step``: two
  forked processes each running a worker's whole clock as the runtime's worker does (copy its
  rows in, zero its gradient, forward and backward, meet, its range of shard.py's fused update,
  meet) with W, the two gradient vectors, G and the history in one shared mapping.  That last
  row is what a runtime of worker *processes* could reach; it reads no batch (each replica keeps
  its rows), gathers no loss and runs no Solver loop, which the runtime's row pays for.

It prints the medians over rounds of the wall time per step and of each thread's CPU time per
step (``time.thread_time``; a process's ``time.process_time``), and ``batch B / in step``: the
most ``--workers 2`` could reach against one thread if the runtime cost nothing; with
``--processes``, also the most any two workers that share nothing could reach on this machine.
Run it next to ``benchmarks/parallel_ratio.py`` (the runtime's own ratio) to see how much of the
gap to 2x is the runtime's.
"""

import argparse
import mmap
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(1, HERE)


def alone(net, steps):
    """(wall s, CPU s) per step of ``net`` trained in this thread."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        net.forward_backward()
    return time.perf_counter() - t0, time.thread_time() - c0


def two_threads(nets, steps, in_step):
    """Wall s per step of two threads each training its net (bound to cores 0 and 1), and each
    thread's CPU s per step; ``in_step``: they meet at a barrier before every step."""
    barrier = threading.Barrier(2) if in_step else None
    cpu = [0.0, 0.0]
    start = threading.Barrier(3)

    def work(k):
        os.sched_setaffinity(0, {k})
        start.wait()
        c0 = time.thread_time()
        for _ in range(steps):
            if barrier is not None:
                barrier.wait()
            nets[k].forward_backward()
        cpu[k] = time.thread_time() - c0

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, cpu


def _process_loop(k, nets, steps, warmup, in_step, barrier, out):
    """One forked process: ``net`` trained on core ``k``, after ``warmup`` steps (the first
    writes copy the parent's pages); puts (k, wall s, CPU s) of the ``steps`` timed ones."""
    os.sched_setaffinity(0, {k})
    net = nets[k]
    for _ in range(warmup):
        net.forward_backward()
    barrier.wait()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        if in_step:
            barrier.wait()
        net.forward_backward()
    out.put((k, time.perf_counter() - t0, time.process_time() - c0))


def _pair(target, args, timeout):
    """Run ``target(k, *args, barrier, out)`` in two processes forked from this one (k = 0, 1),
    which meet at ``barrier`` and each put (k, wall s, CPU s) on ``out``; the slower wall and
    both CPU times.  A process that dies (or a pair not done within ``timeout`` s) ends the
    benchmark with a message; the other process is stopped."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2, timeout=timeout), ctx.Queue()
    procs = [ctx.Process(target=target, args=(k, *args, barrier, out)) for k in range(2)]
    for proc in procs:
        proc.start()
    results, deadline = [], time.monotonic() + timeout
    try:
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=0.1))
            except queue.Empty:
                dead = [proc.exitcode for proc in procs if proc.exitcode]
                if dead:
                    raise SystemExit(f"a process of the pair exited with code {dead[0]}") from None
                if time.monotonic() > deadline:
                    raise SystemExit(f"the pair of processes did not finish within {timeout:g} s") from None
    finally:
        for proc in procs:
            if len(results) < len(procs) and proc.is_alive():
                proc.terminate()
            proc.join()
    results.sort()
    return max(r[1] for r in results), [r[2] for r in results]


def two_processes(nets, steps, warmup, in_step, timeout=600.0):
    """As ``two_threads``, in two processes forked from this one: they share only the machine."""
    return _pair(_process_loop, (nets, steps, warmup, in_step), timeout)


def _bsp_loop(k, trainer, shared, plan, rule, rate, steps, warmup, barrier, out):
    """One forked process: worker ``k``'s whole BSP clock as the runtime's worker runs it (copy
    its rows in, zero its gradient, forward and backward, meet, its range of the sharded update,
    meet), with W, the two gradient vectors, G and the history in ``shared`` memory."""
    os.sched_setaffinity(0, {k})
    w, grads, g, h = shared
    trainer.rep_layouts[k].attach_data(w, copy=False)
    trainer.rep_layouts[k].attach_diff(grads[k])
    net = trainer.replicas[k]
    rows = [(net.blobs[name], net.blobs[name].data.copy()) for name in net.inputs]

    def clock():
        for blob, data in rows:
            blob.data[...] = data
        grads[k][...] = 0
        net.forward_backward()
        barrier.wait()
        plan.run(k, grads, trainer.weights, w, g, [h], rule, rate)
        barrier.wait()

    for _ in range(warmup):
        clock()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        clock()
    out.put((k, time.perf_counter() - t0, time.process_time() - c0))


def bsp_processes(trainer, solver, steps, warmup, timeout=600.0, result=None):
    """Two processes running the two replicas' BSP step (``_bsp_loop``) with the parameters,
    gradients and history in one shared mapping, starting from the trainer's W and history: what
    a runtime of worker *processes* could reach.  The rate is the solver's base_lr, fixed; no
    batch is read (each replica's rows stay those it holds) and no loss is gathered.  A dict
    ``result`` gets the weights after the run ("W")."""
    from minicaffe.parallel.shard import Rule, ShardPlan, rates_and_decays

    n = trainer.W.size
    flat = np.frombuffer(mmap.mmap(-1, 5 * n * 4), np.float32)
    w, grads, g, h = flat[:n], flat[n : 3 * n].reshape(2, n), flat[3 * n : 4 * n], flat[4 * n :]
    w[...] = trainer.W
    h[...] = trainer.H[0]  # (SGD's momentum; the fused pass of SGD and Nesterov reads one vector)
    plan = ShardPlan(trainer.layout.offsets, trainer.layout.counts, *rates_and_decays(solver), 2)
    rule = Rule(solver)
    if rule.code:
        raise SystemExit(f"the BSP processes run SGD's fused pass; this solver is {solver.type}")
    args = (trainer, (w, grads, g, h), plan, rule, solver.param.base_lr, steps, warmup)
    times = _pair(_bsp_loop, args, timeout)
    if result is not None:
        result["W"] = w.copy()
    return times


def stepped(step, steps):
    """(wall s, CPU s of this process) for ``step(steps)``: a solver's or a trainer's run."""
    c0, t0 = time.process_time(), time.perf_counter()
    step(steps)
    return time.perf_counter() - t0, time.process_time() - c0


def _neighbour(kind, stream_mb, stop):
    """Core 1's load next to a step: until ``stop`` is set, a Python arithmetic loop (``fma``:
    registers and L1 only), OpenBLAS SGEMM on 256x256 (``sgemm``: in the core's own L2), or
    copies of a ``stream_mb`` MiB buffer (``stream``: through the shared L3 and memory)."""
    os.sched_setaffinity(0, {1})
    if kind == "fma":
        x = 1.0
        while not stop.is_set():
            for _ in range(10000):
                x = x * 1.0000001 + 1e-9
    elif kind == "sgemm":
        a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
        while not stop.is_set():
            np.dot(a, a)
    else:
        src = np.ones(int(stream_mb * 2**20) // 4, np.float32)
        dst = np.empty_like(src)
        while not stop.is_set():
            np.copyto(dst, src)


def next_to(net, steps, kind, stream_mb):
    """(wall s, CPU s) per step of ``net`` on core 0 while core 1 runs ``_neighbour(kind)``."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    proc = ctx.Process(target=_neighbour, args=(kind, stream_mb, stop))
    proc.start()
    try:
        time.sleep(0.3)  # (the neighbour has started its loop)
        os.sched_setaffinity(0, {0})
        return alone(net, steps)
    finally:
        stop.set()
        proc.join()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--no-processes", dest="processes", action="store_false", help="skip the two-process rows")
    p.add_argument(
        "--no-neighbours", dest="neighbours", action="store_false", help="skip the half batch next to a load"
    )
    p.add_argument("--stream-mb", type=float, default=8.0, help="the buffer the stream neighbour copies, MiB")
    p.add_argument(
        "--no-steps",
        dest="whole_steps",
        action="store_false",
        help="skip the whole steps (solver, runtime, BSP processes)",
    )
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("two threads on two cores: this process may use fewer than 2 cores")

    import lenet_vs_pytorch as bench

    from minicaffe.parallel import ParallelTrainer, blas, lanes

    lanes.set_count(1)
    blas.set_threads(1)
    serial = bench.minicaffe_solver("lenet")
    with ParallelTrainer(bench.minicaffe_solver("lenet"), 2, blas_threads=1) as trainer:
        trainer.step(2)  # (the replicas' Input blobs now hold rows of a batch)
    big, pair = serial.net, trainer.replicas
    whole, half = big.blobs["data"].shape[0], pair[0].blobs["data"].shape[0]
    for net in (big, *pair):
        alone(net, args.warmup)
    one, single = f"one thread, batch {whole}", f"one thread, batch {half}"
    names = [one, single, "two threads, free", "two threads, in step"]
    if args.processes:
        names += ["two processes, free", "two processes, in step"]
    kinds = ("fma", "sgemm", "stream") if args.neighbours else ()
    names += [f"batch {half}, next to {kind}" for kind in kinds]
    solver_step, runtime_step, bsp_step = (
        "one thread, a solver step",
        "--workers 2, a runtime step",
        "two processes, a BSP step",
    )
    runtime = None
    if args.whole_steps:
        names += [solver_step, runtime_step, bsp_step]
        runtime = ParallelTrainer(bench.minicaffe_solver("lenet"), 2, blas_threads=1)
        for step in (serial.step, runtime.step):
            step(args.warmup)
    rows = {name: ([], [], []) for name in names}
    cores = os.sched_getaffinity(0)

    def add(name, wall, cpu):
        rows[name][0].append(wall / args.steps)
        for k, c in enumerate(cpu if isinstance(cpu, list) else [cpu]):
            rows[name][1 + k].append(c / args.steps)

    for _ in range(args.rounds):
        for name, net in ((one, big), (single, pair[0])):
            add(name, *alone(net, args.steps))
        for in_step in (False, True):
            add(f"two threads, {'in step' if in_step else 'free'}", *two_threads(pair, args.steps, in_step))
            if args.processes:
                wall, cpu = two_processes(pair, args.steps, args.warmup, in_step)
                add(f"two processes, {'in step' if in_step else 'free'}", wall, cpu)
        for kind in kinds:
            add(f"batch {half}, next to {kind}", *next_to(pair[0], args.steps, kind, args.stream_mb))
        os.sched_setaffinity(0, cores)
        if runtime is not None:
            add(solver_step, *stepped(serial.step, args.steps))
            add(runtime_step, *stepped(runtime.step, args.steps))
            add(bsp_step, *bsp_processes(trainer, serial, args.steps, args.warmup))
    if runtime is not None:
        runtime.close()
    med = statistics.median
    ms = lambda s: f"{1000.0 * s:7.3f}"  # noqa: E731
    print(f"LeNet TRAIN forward+backward, medians of {args.rounds} rounds x {args.steps} steps; "
          f"load {os.getloadavg()[0]:.2f}; neighbour stream {args.stream_mb:g} MiB")  # fmt: skip
    print(f"  {'':28s} {'wall ms':>8s} {'CPU ms per thread':>20s}")
    for name, (wall, cpu0, cpu1) in rows.items():
        cpu = ms(med(cpu0)) + (f" / {ms(med(cpu1))}" if cpu1 else "")
        print(f"  {name:28s} {ms(med(wall)):>8s} {cpu:>20s}")
    w = {name: med(r[0]) for name, r in rows.items()}

    def ratio(name, base=one):  # the median and range over rounds of round r's base / round r's row
        per = [a / b for a, b in zip(rows[base][0], rows[name][0])]
        return f"{w[base] / w[name]:.2f}x (per round {med(per):.2f}x, {min(per):.2f}..{max(per):.2f})"

    print(
        f"  batch {whole} / two threads free: {ratio('two threads, free')}; / in step: {ratio('two threads, in step')}"
    )
    print("    (the most --workers 2 could reach against one thread if its runtime cost nothing)")
    if args.processes:
        print(f"  batch {whole} / two processes free: {ratio('two processes, free')}; / in step: "
              f"{ratio('two processes, in step')}")  # fmt: skip
        print("    (two workers that share nothing but the machine)")
    if runtime is not None:
        print(f"  a solver step / the runtime's: {ratio(runtime_step, solver_step)}; / the BSP processes': "
              f"{ratio(bsp_step, solver_step)}")  # fmt: skip
        print("    (whole steps: the update too; the runtime also reads the batch and runs the Solver's loop)")
    for kind in kinds:
        print(f"  batch {half} next to {kind}: {w[f'batch {half}, next to {kind}'] / w[single]:.2f}x its time alone")


if __name__ == "__main__":
    main()
