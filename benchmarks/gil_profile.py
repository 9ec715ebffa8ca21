"""Who holds the GIL during a training step, and for how long: py-spy's --gil samples, summed;
and what each thread costs per step: its CPU time and its wait for a core, from the kernel.

    pip install py-spy                                  # a sampling profiler; not a minicaffe dependency
    python benchmarks/gil_profile.py                    # LeNet, --workers 2, 400 steps
    python benchmarks/gil_profile.py --mode lanes --steps 200
    python benchmarks/gil_profile.py --update server    # --workers 2 with the server's own update
    python benchmarks/gil_profile.py --no-gil           # the per-thread CPU table only (no py-spy)
    python benchmarks/gil_profile.py --step1            # trainer.step(1) per step (a run per step)
    python benchmarks/gil_profile.py --raw stacks.txt   # keep py-spy's samples, every stack whole

Per thread (Linux ``/proc/self/task/<id>/schedstat``, read every 50 ms by a monitor thread while
the timed steps run, in the run without py-spy): ms of CPU per step, ms per step spent runnable
but waiting for a core, and voluntary sleeps per step (waits for the GIL, a lock or a condition).
The threads are named by their Python names (the server is MainThread; minicaffe-worker-k;
minicaffe-prefetch: the data reader's).

py-spy samples every thread ``--rate`` times a second and, with ``--gil``, keeps only the sample
of the thread that holds the GIL at that instant (a thread inside a numba ``nogil`` kernel or a
BLAS call that released the GIL is not counted: checked on a nogil spin loop and a released
matmul, which get no samples).  py-spy attaches after 20 warm-up steps (compilation, first
allocations); the samples taken inside the training loop, divided by the steps, are the
GIL-held milliseconds per step; they are split by thread (the server = the main
thread, the workers or lanes), by what the thread was doing (the layer call it was in, by the
outermost frame in minicaffe/layers/, else the runtime's or the solver's own lines) and by the
Python line that held it.  py-spy slows the process a
little; the step time printed is measured without it, in a run of its own.
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _schedstat():
    """{native thread id: (cpu ns, runnable-waiting ns, voluntary switches)} of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = f.read().split()
            with open(f"/proc/self/task/{tid}/status") as f:
                vol = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration, ValueError):
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(run), int(wait), vol)
    return out


def thread_costs(step, steps):
    """Run ``step(steps)``; return {thread name: (cpu ms, core-wait ms, sleeps) per step}."""
    import threading

    first, latest, names, stop = _schedstat(), {}, {}, threading.Event()

    def monitor():
        while not stop.is_set():
            latest.update(_schedstat())
            for t in threading.enumerate():
                names.setdefault(t.native_id, t.name)
            stop.wait(0.05)

    mon = threading.Thread(target=monitor, name="monitor", daemon=True)
    mon.start()
    step(steps)
    stop.set()
    mon.join()
    latest.update(_schedstat())
    for t in threading.enumerate():
        names.setdefault(t.native_id, t.name)
    costs = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for tid, (run, wait, vol) in latest.items():
        name = names.get(tid, f"thread {tid}")
        if name == "monitor":
            continue
        r0, w0, v0 = first.get(tid, (0, 0, 0))
        name = re.sub(r"-\d+$", "", name) if name.startswith("minicaffe-pref") else name
        c = costs[name]
        c[0] += (run - r0) / 1e6 / steps
        c[1] += (wait - w0) / 1e6 / steps
        c[2] += (vol - v0) / steps
    return {k: v for k, v in costs.items() if v[0] > 0.005}


def child(mode, steps, wait, update="sharded", step1=False):
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
    trainer = None
    if mode == "workers":
        extra = {"shard_update": False} if update == "server" else {}
        trainer = ParallelTrainer(solver, 2, blas_threads=1, **extra)
        step = trainer.step
    else:
        lanes.set_count(2 if mode == "lanes" else 1)
        step = solver.step
    if step1:  # one run per step, as a training loop that calls step(1) does
        run = step

        def step(n):
            for _ in range(n):
                run(1)

    step(20)
    if wait:
        print("WARM", flush=True)
        sys.stdin.readline()
    t0 = time.perf_counter()
    if wait:
        step(steps)
    else:
        costs = thread_costs(step, steps)
        print("THREADS " + json.dumps(costs), flush=True)
        if trainer is not None and not step1:  # (a step(1) loop's stats are those of its last run)
            print("PHASES " + json.dumps(trainer.stats()), flush=True)
    print(f"STEP_MS {1000 * (time.perf_counter() - t0) / steps:.3f}", flush=True)


def doing(frames):
    """What a thread holding the GIL was doing: the layer call (outermost frame in
    minicaffe/layers/), else the innermost frame's file (the runtime, the solver, ...)."""
    for f in frames:
        func, _, where = f.partition(" (")
        if "/layers/" in where:
            return f"layer {func}"
    func, _, where = frames[-1].partition(" (")
    return "/".join(where.rstrip(")").split(":")[0].split("/")[-2:])


def summarize(path, steps, marker):
    by_thread, by_line, by_doing = collections.Counter(), collections.Counter(), collections.Counter()
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
            by_doing[f"{'server' if thread.startswith('main') else 'workers'}: {doing(frames[1:])}"] += n
            func, _, where = frames[-1].partition(" (")
            by_line[f"{func} ({'/'.join(where.rstrip(')').split('/')[-2:])})"] += n
            total += n
    return total, by_thread, by_line, by_doing


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("workers", "lanes", "serial"), default="workers")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--rate", type=int, default=1000, help="samples per second")
    p.add_argument("--top", type=int, default=12)
    p.add_argument(
        "--update",
        choices=("sharded", "server"),
        default="sharded",
        help="workers mode: the reduce + SGD update sharded over the workers (the default) or on the server",
    )
    p.add_argument("--no-gil", action="store_true", help="only the per-thread CPU table (no py-spy)")
    p.add_argument("--step1", action="store_true", help="time step(1) calls (one run each), not one long run")
    p.add_argument("--raw", help="also copy py-spy's raw samples (one stack per line, with counts) here")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2] == "1", args.child[3], args.child[4] == "1")
    if shutil.which("py-spy") is None and not args.no_gil:
        raise SystemExit("py-spy is not installed: pip install py-spy (or --no-gil)")
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", args.mode, str(args.steps), None, args.update]
    cmd.append("1" if args.step1 else "0")
    plain = subprocess.run(cmd[:5] + ["0"] + cmd[6:], env=env, capture_output=True, text=True, check=True).stdout
    step_ms = float(re.search(r"STEP_MS (\S+)", plain).group(1))
    costs = json.loads(re.search(r"THREADS (.*)", plain).group(1))
    label = f"{args.mode}" + (f", {args.update} update" if args.mode == "workers" else "")
    label += ", step(1) per step" if args.step1 else ""
    print(f"LeNet, {label}: {step_ms:.2f} ms per step; per thread, ms per step (CPU / waiting for a core / sleeps):")
    for name, (cpu, runq, vol) in sorted(costs.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:24s} {cpu:6.2f} / {runq:5.2f} / {vol:5.1f}")
    total = sum(c[0] for c in costs.values())
    print(f"  {'all threads':24s} {total:6.2f} ms of CPU per step ({total / step_ms:.2f} cores busy)")
    phases = re.search(r"PHASES (.*)", plain)
    if phases:  # the trainer's own clocks (ParallelTrainer.stats), ms per step
        s = json.loads(phases.group(1))
        ms = lambda x: f"{1000 * x:5.2f}"  # noqa: E731
        print("  per worker, ms per step: wait for the batch and W / copy rows, zero G / forward+backward / "
              "wait for the gradients / its range of the update")  # fmt: skip
        for k in range(len(s["worker_compute"])):
            row = [s[f"worker_{x}"][k] for x in ("wait", "copy", "compute", "sync", "update")]
            print(f"  worker {k:<17d} " + " / ".join(ms(x) for x in row))
        print(f"  server: fetch {ms(s['server_fetch'])}, reduce and losses {ms(s['server_reduce'])}, "
              f"the Solver's loop after the gradients {ms(s['server_update'])}")  # fmt: skip
    if args.no_gil:
        return
    cmd[5] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "gil.txt")
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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
        total, by_thread, by_line, by_doing = summarize(raw, args.steps, marker)
        if args.raw:
            shutil.copyfile(raw, args.raw)
    per = lambda n: 1000.0 * n / args.rate / args.steps  # noqa: E731
    print(f"GIL held {per(total):.2f} ms per step (py-spy --gil, {args.rate} Hz, in a run of its own)")
    for thread, n in by_thread.most_common():
        print(f"  {thread:<22s} {per(n):6.2f} ms per step")
    print("What the threads holding it were doing, ms per step:")
    for what, n in by_doing.most_common(args.top):
        print(f"  {per(n):6.3f}  {what}")
    print("Python lines holding the GIL, ms per step:")
    for where, n in by_line.most_common(args.top):
        print(f"  {per(n):6.3f}  {where}")


if __name__ == "__main__":
    main()
