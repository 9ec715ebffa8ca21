"""Who holds the GIL during a training step, and for how long: py-spy's --gil samples, summed.

    pip install py-spy                                  # a sampling profiler; not a minicaffe dependency
    python benchmarks/gil_profile.py                    # LeNet, --workers 2, 400 steps
    python benchmarks/gil_profile.py --mode lanes --steps 200

py-spy samples every thread ``--rate`` times a second and, with ``--gil``, keeps only the sample
of the thread that holds the GIL at that instant (a thread inside a numba ``nogil`` kernel or a
BLAS call that released the GIL is not counted: checked on a nogil spin loop and a released
matmul, which get no samples).  py-spy attaches after 20 warm-up steps (compilation, first
allocations); the samples taken inside the training loop, divided by the steps, are the
GIL-held milliseconds per step; they are split by thread (the server = the main
thread, the workers or lanes) and by the Python line that held it.  py-spy slows the process a
little; the step time printed is measured without it, in a run of its own.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child(mode, steps, wait):
    """The training loop to profile: LeNet on real MNIST, BLAS 1 thread per worker or lane.
    With ``wait``, it says WARM after the warm-up and waits for a line on stdin (the profiler
    attaches in between), so compilation and first allocations are not sampled."""
    sys.path.insert(0, ROOT)
    import minicaffe as caffe
    from minicaffe.parallel import ParallelTrainer, blas, lanes

    caffe.set_random_seed(1)
    solver = caffe.get_solver(os.path.join(ROOT, "nets", "lenet_solver.prototxt"), log=lambda m: None)
    solver.param.display = 0
    solver.param.test_interval = 0
    blas.set_threads(1)
    if mode == "workers":
        step = ParallelTrainer(solver, 2, blas_threads=1).step
    else:
        lanes.set_count(2 if mode == "lanes" else 1)
        step = solver.step
    step(20)
    if wait:
        print("WARM", flush=True)
        sys.stdin.readline()
    t0 = time.perf_counter()
    step(steps)
    print(f"STEP_MS {1000 * (time.perf_counter() - t0) / steps:.3f}", flush=True)


def summarize(path, steps, marker):
    by_thread, by_line = collections.Counter(), collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if marker not in stack:
                continue  # outside the training loop (imports, set-up)
            frames = stack.split(";")
            thread = "main (server)" if "MainThread" in frames[0] else "helper (worker/lane)"
            n = int(n)
            by_thread[thread] += n
            func, _, where = frames[-1].partition(" (")
            by_line[f"{func} ({'/'.join(where.rstrip(')').split('/')[-2:])})"] += n
            total += n
    return total, by_thread, by_line


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("workers", "lanes", "serial"), default="workers")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--rate", type=int, default=1000, help="samples per second")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2] == "1")
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", args.mode, str(args.steps)]
    plain = subprocess.run(cmd + ["0"], env=env, capture_output=True, text=True, check=True).stdout
    step_ms = float(re.search(r"STEP_MS (\S+)", plain).group(1))
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "gil.txt")
        proc = subprocess.Popen(cmd + ["1"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "WARM"
        spy = subprocess.Popen(
            ["py-spy", "record", "--gil", "--threads", "--nonblocking", "-r", str(args.rate), "-f", "raw", "-o", raw]
            + ["--pid", str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attached
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.wait()
        spy.wait()
        marker = "runtime.py" if args.mode == "workers" else "solver.py"
        total, by_thread, by_line = summarize(raw, args.steps, marker)
    per = lambda n: 1000.0 * n / args.rate / args.steps  # noqa: E731
    print(f"LeNet, {args.mode}: {step_ms:.2f} ms per step (without py-spy); GIL held {per(total):.2f} ms per step")
    for thread, n in by_thread.most_common():
        print(f"  {thread:<22s} {per(n):6.2f} ms per step")
    print("Python lines holding the GIL, ms per step:")
    for where, n in by_line.most_common(args.top):
        print(f"  {per(n):6.3f}  {where}")


if __name__ == "__main__":
    main()
