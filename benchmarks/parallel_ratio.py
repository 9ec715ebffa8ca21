"""``--workers N`` against one thread, in one process, in alternating bursts: the speedup with
the machine's drift taken out.

    python benchmarks/parallel_ratio.py                        # LeNet, 2 workers, 30 bursts of 10 steps
    python benchmarks/parallel_ratio.py --net cifar10_quick --bursts 10 --steps 5
    python benchmarks/parallel_ratio.py --code ../other        # another checkout's code (A/B in a loop)

On a shared virtual machine the one-thread step moves by 10-20% from one minute to the next
(LeNet: 9.3 to 11.5 ms in one benchlock call), so a ratio of two configurations timed in separate
processes, a minute apart, moves as much as the change one wants to see.  Here one process
builds two identical solvers (``benchmarks/lenet_vs_pytorch.py``'s: LeNet on real MNIST, or
CIFAR-10 quick on synthetic data; seed 1), one run by the Solver alone (one lane, OpenBLAS 1
thread: "minicaffe 1 thread") and one by a ParallelTrainer with N workers ("minicaffe --workers
N"), and times them in alternating bursts of ``--steps`` calls of ``step(1)`` each (as
lenet_vs_pytorch times them; a burst's step is their median) or, with ``--continuous``, one
``step(steps)`` call each (a burst's step is its mean: continuous training, a run's start and end
counted once), after ``--warmup`` steps of each; 50 ms pass before each burst (the other
solver's data reader refills its prefetch queue meanwhile, not during the timing).  Per burst
the ratio of the two steps; the summary is the median over bursts of the one-thread step, of
the N-worker step and of the per-burst ratio, with its quartiles.  The load average is printed
before and after.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--net", default="lenet", choices=("lenet", "cifar10_quick"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bursts", type=int, default=30)
    p.add_argument("--steps", type=int, default=10, help="step(1) calls per configuration and burst")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument(
        "--continuous", action="store_true", help="time each burst as one step(steps) call (one run), not step(1) calls"
    )
    p.add_argument("--code", help="import minicaffe (and its nets) from this checkout instead of this one")
    args = p.parse_args(argv)
    root = os.path.abspath(args.code) if args.code else os.path.dirname(HERE)
    sys.path.insert(0, root)
    sys.path.insert(1, HERE)
    import lenet_vs_pytorch as bench

    bench.ROOT = root  # the solver's nets/ and the minicaffe it imports: the same checkout

    from minicaffe.parallel import ParallelTrainer, blas, lanes

    lanes.set_count(1)
    blas.set_threads(1)
    serial = bench.minicaffe_solver(args.net)
    trainer = ParallelTrainer(bench.minicaffe_solver(args.net), args.workers, blas_threads=1)
    runs = {"1 thread": serial.step, f"--workers {args.workers}": trainer.step}
    how = f"one step({args.steps}) call" if args.continuous else f"{args.steps} step(1) calls"
    print(f"{args.net}: one thread against --workers {args.workers} in {args.bursts} alternating bursts of "
          f"{how}; code {root}; load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    for step in runs.values():
        step(args.warmup)
    med = {name: [] for name in runs}
    for _ in range(args.bursts):
        for name, step in runs.items():
            # the other solver's data reader refills its prefetch queue after a burst: let it
            # finish, so that its thread does not take a core from this burst's timing
            time.sleep(0.05)
            if args.continuous:
                t = time.perf_counter()
                step(args.steps)
                med[name].append((time.perf_counter() - t) / args.steps)
                continue
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step(1)
                times.append(time.perf_counter() - t)
            med[name].append(statistics.median(times))
    one, many = med.values()
    ratios = sorted(a / b for a, b in zip(one, many))
    q = statistics.quantiles(ratios, n=4)
    ms = lambda s: f"{1000 * s:.2f}"
    print(f"  one thread  {ms(statistics.median(one))} ms  (bursts {ms(min(one))} .. {ms(max(one))})")
    print(f"  --workers {args.workers} {ms(statistics.median(many))} ms  (bursts {ms(min(many))} .. {ms(max(many))})")
    print(f"  ratio       {statistics.median(ratios):.3f}x  (quartiles {q[0]:.3f} .. {q[2]:.3f}; "
          f"of the medians {statistics.median(one) / statistics.median(many):.3f}x); load {os.getloadavg()[0]:.2f}")  # fmt: skip
    trainer.close()


if __name__ == "__main__":
    main()
