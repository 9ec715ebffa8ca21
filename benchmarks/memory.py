"""Peak resident memory of ``python -m minicaffe.train lenet``, beside what Python, numpy and numba
hold by themselves, and where the rest goes, in one run.

    python benchmarks/memory.py                    # short run (--iters 200, tests at 100 and 200)
    python benchmarks/memory.py --iters 500 --full # and the whole 10,000-iteration run

Every row is a fresh process; its peak is the kernel's own count (``ru_maxrss`` of the child,
read with ``os.wait4``: the most resident memory it ever held, file-backed pages of shared
libraries included, as ``/usr/bin/time -v`` reports it).  The baselines:

  python                     ``python -c pass``
  python + numpy             ``import numpy``
  python + numpy + numba     ``import numpy, numba`` (numba loads LLVM's library, llvmlite)
  ... + one cached kernel    one of minicaffe's kernels called, its machine code loaded from
                             numba's on-disk cache: what LLVM's JIT costs on a warm cache
                             (numba's runtime module is compiled, the JIT engine created)
  ... + one BLAS sgemm       one float32 GEMM of LeNet's largest shape (OpenBLAS's work buffers)

Then the train tool itself (``--no-plot`` and with its curves.png), and a breakdown: a child
process goes through what the tool does, stage by stage (import the tool, open the data, build
the nets, plan their arena, the first iteration, more iterations, a test, a snapshot, release
the nets, the plot), printing the
resident memory after each (VmRSS), the peak so far (VmHWM) and, from a second child run under
``tracemalloc``, the bytes numpy holds in arrays at that point.  Ratios are to the target
(150 MiB) and to the python + numpy + numba baseline.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_MIB = 150.0

BASELINES = [
    ("python", "pass"),
    ("python + numpy", "import numpy"),
    ("python + numpy + numba", "import numpy, numba"),
    (
        "python + numpy + numba + one cached kernel",
        "import numpy as np, numba\nfrom kernels import elementwise\nx = np.ones(64, np.float32)\n"
        "elementwise.relu_fwd_v2_typed(x, 0.0, x)",
    ),
    (
        "... + one BLAS sgemm (LeNet conv2, 1 thread)",
        "import numpy as np, numba\nfrom kernels import elementwise\nx = np.ones(64, np.float32)\n"
        "elementwise.relu_fwd_v2_typed(x, 0.0, x)\nfrom minicaffe.parallel import blas\nblas.set_threads(1)\n"
        "a = np.ones((50, 500), np.float32); b = np.ones((500, 4096), np.float32); np.dot(a, b)",
    ),
]


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def measure(cmd, cwd=None):
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd or ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return usage.ru_maxrss / 1024.0, time.perf_counter() - t0, out


# -- the stage-by-stage child ----------------------------------------------------------------------
def status_mib():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def stages_child(iters, traced):
    """Go through the train tool's stages in this process; print one JSON line per stage."""
    if traced:
        import tracemalloc

        tracemalloc.start()
    import numba  # noqa: F401
    import numpy as np

    def mark(name):
        row = {"stage": name, **status_mib()}
        if traced:
            import tracemalloc

            domain = np.lib.tracemalloc_domain
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])
            row["numpy"] = sum(s.size for s in snap.statistics("filename")) / 2**20
        print(json.dumps(row), flush=True)

    mark("python + numpy + numba imported")
    from minicaffe.tools import train
    from minicaffe.tools.common import resolve_solver

    mark("train tool imported")
    from minicaffe.parallel import blas, lanes
    from minicaffe.solvers import get_solver, load_solver_param

    n = max(1, blas.cores())
    lanes.set_count(n)
    blas.set_threads(1)
    from minicaffe.data import get_dataset

    get_dataset("mnist_train"), get_dataset("mnist_test")
    mark("MNIST opened")
    out_dir = tempfile.mkdtemp(prefix="minicaffe-memory-")
    param, base_dir = load_solver_param(resolve_solver("lenet"))
    param.snapshot_prefix = os.path.join(out_dir, "lenet")
    solver = get_solver(param, base_dir=base_dir, log=lambda *a: None)
    mark("nets built (train batch 64, test batch 100)")
    from minicaffe.memory import plan_training

    arena = plan_training(solver, run_first=False)  # what the train tool does
    mark(f"one arena planned ({arena.size / 2**20:.1f} MiB; unshared {arena.naive / 2**20:.1f})")
    solver.step(1)
    mark("first iteration (kernels from numba's cache, BLAS buffers)")
    solver.step(iters - 1)
    mark(f"{iters} iterations")
    solver.test_all()
    mark("a test (100 batches of 100)")
    solver.step(iters)
    mark(f"{2 * iters} iterations")
    solver.snapshot()
    mark("a snapshot")
    import gc

    solver = arena = None
    gc.collect()
    mark("nets, arena and data readers released")
    data = {
        "train": {"iter": list(range(10)), "seconds": list(range(10)), "loss": [1.0 / (i + 1) for i in range(10)]},
        "test": [{"net": 0, "iter": 9, "seconds": 9, "outputs": {"loss": 0.1, "accuracy": 0.9}}],
        "solver": "lenet_solver.prototxt",
    }
    train.plot_curves(data, os.path.join(out_dir, "curves.png"))
    mark("curves.png drawn (matplotlib)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="iterations of the short train run (tests every iters/2)")
    ap.add_argument("--full", action="store_true", help="also run the whole 10,000 iterations (about 2.5 minutes)")
    ap.add_argument("--stages-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if args.stages_child:
        return stages_child(args.stages_child, args.traced)

    py = sys.executable
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    for name, code in BASELINES:
        mib, secs, _ = measure([py, "-c", code])
        rows.append((name, mib, secs))
    base = rows[2][1]
    work = tempfile.mkdtemp(prefix="minicaffe-memory-")
    runs = [("--no-plot", ["--no-plot"]), ("", [])]
    for label, extra in runs:
        cmd = [py, "-m", "minicaffe.train", "lenet", "--iters", str(args.iters)]
        cmd += ["--test-interval", str(max(1, args.iters // 2)), "--output", os.path.join(work, f"run{len(rows)}")]
        mib, secs, _ = measure(cmd + extra, cwd=work)
        rows.append((f"train lenet --iters {args.iters} {label}".strip(), mib, secs))
    if args.full:
        mib, secs, _ = measure([py, "-m", "minicaffe.train", "lenet", "--output", os.path.join(work, "full")], cwd=work)
        rows.append(("train lenet (10,000 iterations)", mib, secs))

    print()
    print(f"| process | peak MiB | x target ({TARGET_MIB:.0f} MiB) | x python+numpy+numba | seconds |")
    print("|---|---|---|---|---|")
    for name, mib, secs in rows:
        print(f"| {name} | {mib:.1f} | {mib / TARGET_MIB:.2f} | {mib / base:.2f} | {secs:.1f} |")

    stages = {}
    for traced in (False, True):
        cmd = [py, os.path.abspath(__file__), "--stages-child", str(max(2, args.iters // 2))]
        _, _, out = measure(cmd + (["--traced"] if traced else []), cwd=work)
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                stages.setdefault(row["stage"], {}).update(
                    {k + ("_traced" if traced else ""): v for k, v in row.items() if k != "stage"}
                )
    print()
    print("Stage by stage (one process going through the train tool's stages; numpy MiB from a second run")
    print("under tracemalloc):")
    print()
    print("| stage | RSS MiB | + MiB | of it file-backed | peak so far | numpy arrays MiB |")
    print("|---|---|---|---|---|---|")
    prev = None
    for name, s in stages.items():
        delta = "" if prev is None else f"{s['VmRSS'] - prev:+.1f}"
        print(
            f"| {name} | {s['VmRSS']:.1f} | {delta} | {s['RssFile']:.1f} | {s['VmHWM']:.1f} | "
            f"{s.get('numpy_traced', float('nan')):.1f} |"
        )
        prev = s["VmRSS"]
    print()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "stages": stages, "load": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
