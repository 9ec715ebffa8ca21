"""What two threads can do at best on this machine, with no runtime: the floor under ``--workers 2``.

    python benchmarks/parallel_floor.py                     # LeNet, 5 rounds of 200 steps
    python benchmarks/parallel_floor.py --rounds 7 --steps 300

Two workers each run the training net's forward and backward on half the batch.  Before any
runtime cost (no gradients reduced, no update, no batch fetched), two threads doing only that
already take longer than one thread does on half the batch: they share the memory system, and
each hands the GIL to the other between its kernels.  This script measures that, in one process
(one lane, OpenBLAS 1 thread), on the nets ``benchmarks/parallel_ratio.py`` trains (LeNet on
MNIST: the solver's net, which reads its batch through its Data layer, and the two replicas of a
``ParallelTrainer``, Input layers holding a batch's rows), alternating in each round:

* ``one thread, batch B``: the solver's net, ``net.forward_backward()`` in a loop;
* ``one thread, batch B/2``: worker 0's replica, alone on the machine;
* ``two threads, free``: the two replicas, one per thread, each bound to its own core, each
  looping on its own;
* ``two threads, in step``: the same, meeting at a ``threading.Barrier`` before every step, as
  BSP's workers meet at every clock.

It prints the medians over rounds of the wall time per step and of each thread's CPU time per
step (``time.thread_time``), and ``batch B / in step``: the most ``--workers 2`` could reach
against one thread if the runtime cost nothing.  Run it next to ``benchmarks/parallel_ratio.py``
(the runtime's own ratio) to see how much of the gap to 2x is the runtime's.
"""

import argparse
import os
import statistics
import sys
import threading
import time

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
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
    rows = {name: ([], [], []) for name in (f"one thread, batch {whole}", f"one thread, batch {half}", "two threads, free", "two threads, in step")}  # fmt: skip
    cores = os.sched_getaffinity(0)
    for _ in range(args.rounds):
        for name, net in ((f"one thread, batch {whole}", big), (f"one thread, batch {half}", pair[0])):
            wall, cpu = alone(net, args.steps)
            rows[name][0].append(wall / args.steps)
            rows[name][1].append(cpu / args.steps)
        for name, in_step in (("two threads, free", False), ("two threads, in step", True)):
            wall, cpu = two_threads(pair, args.steps, in_step)
            rows[name][0].append(wall / args.steps)
            rows[name][1].append(cpu[0] / args.steps)
            rows[name][2].append(cpu[1] / args.steps)
        os.sched_setaffinity(0, cores)
    med = statistics.median
    ms = lambda s: f"{1000.0 * s:7.3f}"  # noqa: E731
    print(f"LeNet TRAIN forward+backward, medians of {args.rounds} rounds x {args.steps} steps; "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"  {'':24s} {'wall ms':>8s} {'CPU ms per thread':>20s}")
    for name, (wall, cpu0, cpu1) in rows.items():
        cpu = ms(med(cpu0)) + (f" / {ms(med(cpu1))}" if cpu1 else "")
        print(f"  {name:24s} {ms(med(wall)):>8s} {cpu:>20s}")
    w = {name: med(r[0]) for name, r in rows.items()}
    one, free, step = w[f"one thread, batch {whole}"], w["two threads, free"], w["two threads, in step"]
    print(f"  batch {whole} / free: {one / free:.2f}x; batch {whole} / in step: {one / step:.2f}x (the most "
          f"--workers 2 could reach against one thread if its runtime cost nothing)")  # fmt: skip


if __name__ == "__main__":
    main()
