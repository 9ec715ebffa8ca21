"""Peak resident memory of ``python -m minicaffe.train lenet``, beside what Python, numpy and numba
hold by themselves, and where the rest goes, in one run.

    python benchmarks/memory.py                    # short run (--iters 200, tests at 100 and 200)
    python benchmarks/memory.py --iters 500 --full # and the whole 10,000-iteration run

Every row is a fresh process; its peak is the kernel's own count (``ru_maxrss`` of the child,
read with ``os.wait4``: the most resident memory it ever held, file-backed pages of shared
libraries included, its exit included, as ``/usr/bin/time -v`` reports it).  This script
imports nothing but the standard library: a child's ``ru_maxrss`` starts from its parent's
resident size when it is spawned (Linux counts the parent's pages until the exec), so a large
parent would be measured instead of a small child.  The baselines:

  python                     ``python -c pass``
  python + numpy             ``import numpy``
  python + numpy + numba     ``import numpy, numba`` (numba loads LLVM's library, llvmlite)
  ... + one cached kernel    one of minicaffe's kernels called, its machine code loaded from
                             numba's on-disk cache: what LLVM's JIT costs on a warm cache
                             (numba's runtime module is compiled, the JIT engine created)
  ... + one BLAS sgemm       one float32 GEMM of LeNet's largest shape (OpenBLAS's work buffers)

Then the train tool itself (``--no-plot`` and with its curves.png), and a breakdown: a child
process goes through what the tool does, stage by stage (import the tool, release LLVM's code,
load numba's runtime, open the data, build the nets, plan their arena, the first iteration, more
iterations, a test, a snapshot, release the nets, the plot), printing after each the resident
memory (VmRSS), the peak so far (VmHWM), where it is by mapping (/proc/self/smaps: LLVM's code,
the other libraries, the C heap, anonymous memory) and, from a second child run under
``tracemalloc``, the bytes numpy holds in arrays.  A thread of the first child samples VmRSS
every millisecond and prints, at the highest, the resident MiB of every mapping.  Ratios are to
the target (150 MiB) and to the python + numpy + numba baseline.
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
LLVM_LIBRARIES = ("libllvmlite", "libLLVM")  # as minicaffe/memory/jitcode.py finds LLVM's library


def status_mib():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def smaps_mib():
    """{mapping: resident MiB} of this process from /proc/self/smaps: a shared library or file by
    its base name; [heap], [stack], and anonymous mappings (numpy's large arrays, the arena,
    Python's object arenas, thread stacks, OpenBLAS's and LLVM's buffers) together as [anon]."""
    out = {}
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if "-" in head and not head.endswith(":"):
                fields = rest.split(None, 4)
                path = fields[4].strip() if len(fields) > 4 else ""
                name = os.path.basename(path) if path.startswith("/") else (path if path in ("[heap]",) else "[anon]")
            elif head == "Rss:":
                out[name] = out.get(name, 0.0) + int(rest.split()[0]) / 1024.0
    return out


def categories(smaps):
    """The per-mapping MiB summed into: LLVM's code, OpenBLAS's code, the other files (Python,
    numpy, C libraries, extension modules), the C heap ([heap]: malloc), anonymous mappings."""
    out = {"llvm": 0.0, "openblas": 0.0, "files": 0.0, "heap": 0.0, "anon": 0.0}
    for name, mib in smaps.items():
        if name.startswith(LLVM_LIBRARIES):
            out["llvm"] += mib
        elif "openblas" in name:
            out["openblas"] += mib
        elif name == "[heap]":
            out["heap"] += mib
        elif name.startswith("["):
            out["anon"] += mib
        else:
            out["files"] += mib
    return out


class PeakWatch:
    """A thread that reads VmRSS every millisecond and, at each new high, records the stage and
    the resident MiB per mapping: where the peak's bytes were.  (A spike shorter than a poll can
    be missed: VmHWM, the kernel's own high-water mark, is printed beside it.)"""

    def __init__(self):
        import threading

        self.stage, self.rss, self.at, self.smaps = "start", 0.0, None, {}
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            rss = status_mib()["VmRSS"]
            if rss > self.rss + 0.25:
                self.rss, self.at, self.smaps = rss, self.stage, smaps_mib()
            time.sleep(0.001)


def stages_child(iters, traced):
    """Go through the train tool's stages in this process; print one JSON line per stage."""
    if traced:
        import tracemalloc

        tracemalloc.start()
    import numba  # noqa: F401
    import numpy as np

    watch = None if traced else PeakWatch()

    def mark(name):
        row = {"stage": name, **status_mib(), **categories(smaps_mib())}
        if traced:
            import tracemalloc

            domain = np.lib.tracemalloc_domain
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])
            row["numpy"] = sum(s.size for s in snap.statistics("filename")) / 2**20
        print(json.dumps(row), flush=True)
        if watch is not None:
            watch.stage = f"after: {name}"

    mark("python + numpy + numba imported")
    from minicaffe.memory import jitcode
    from minicaffe.tools import train
    from minicaffe.tools.common import resolve_solver

    mark("train tool imported")
    with jitcode.keep_llvm_code_out():  # what the train tool's main does
        mark("LLVM's code released (what importing numba touched)")
        from minicaffe.parallel import blas, lanes
        from minicaffe.solvers import get_solver, load_solver_param

        n = max(1, blas.cores())
        lanes.set_count(n)
        blas.set_threads(1)
        jitcode.load_jit_runtime()
        mark("numba's runtime and JIT engine loaded (one cached kernel), LLVM's code released")
        from minicaffe.data import get_dataset

        param, base_dir = load_solver_param(resolve_solver("lenet"))
        from minicaffe.memory import preload

        tool = train.build_parser().parse_args(["lenet"])  # the train tool's defaults, as its key sees them
        loaded = preload.load(train.preload_key(param, base_dir, "cpu", n, tool))
        mark(f"the kernels the last run loaded, loaded ({loaded}; 0 on a first run)")
        get_dataset("mnist_train"), get_dataset("mnist_test")
        mark("MNIST opened")
        out_dir = tempfile.mkdtemp(prefix="minicaffe-memory-")
        param.snapshot_prefix = os.path.join(out_dir, "lenet")
        solver = get_solver(param, base_dir=base_dir, log=lambda *a: None)
        mark("nets built (train batch 64, test batch 100)")
        from minicaffe.memory import plan_training

        arena = plan_training(solver, run_first=False)  # what the train tool does
        mark(f"one arena planned ({arena.size / 2**20:.1f} MiB; unshared {arena.naive / 2**20:.1f})")
        solver.step(1)
        mark("first iteration (kernels from numba's cache, arena touched, BLAS buffers)")
        solver.step(iters - 1)
        mark(f"{iters} iterations")
        solver.test_all()
        mark("a test (100 batches of 100)")
        solver.step(iters)
        mark(f"{2 * iters} iterations")
        solver.snapshot()
        mark("a snapshot")
        from minicaffe.memory.planner import trim_heap

        solver = arena = None
        trim_heap()  # what the train tool does before the plot
        mark("nets, arena and data readers released, C heap trimmed")
        data = {
            "train": {"iter": list(range(10)), "seconds": list(range(10)), "loss": [1.0 / (i + 1) for i in range(10)]},
            "test": [{"net": 0, "iter": 9, "seconds": 9, "outputs": {"loss": 0.1, "accuracy": 0.9}}],
            "solver": "lenet_solver.prototxt",
        }
        train.plot_curves(data, os.path.join(out_dir, "curves.png"))
        mark("curves.png drawn (matplotlib)")
    if watch is not None:
        top = sorted(watch.smaps.items(), key=lambda kv: -kv[1])
        print(json.dumps({"peak": watch.rss, "at": watch.at, "VmHWM": status_mib()["VmHWM"], "mappings": top}))


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

    stages, peak = {}, None
    for traced in (False, True):
        cmd = [py, os.path.abspath(__file__), "--stages-child", str(max(2, args.iters // 2))]
        _, _, out = measure(cmd + (["--traced"] if traced else []), cwd=work)
        for line in out.splitlines():
            if line.startswith('{"peak"'):
                peak = json.loads(line)
            elif line.startswith("{"):
                row = json.loads(line)
                stages.setdefault(row["stage"], {}).update(
                    {k + ("_traced" if traced else ""): v for k, v in row.items() if k != "stage"}
                )
    print()
    print("Stage by stage (one process going through the train tool's stages; resident MiB after each,")
    print("from /proc/self/status and /proc/self/smaps; numpy MiB from a second run under tracemalloc):")
    print()
    print(
        "| stage | RSS MiB | + MiB | peak so far | LLVM's code | other libraries | C heap | anonymous | numpy arrays |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    prev = None
    for name, s in stages.items():
        delta = "" if prev is None else f"{s['VmRSS'] - prev:+.1f}"
        print(
            f"| {name} | {s['VmRSS']:.1f} | {delta} | {s['VmHWM']:.1f} | {s['llvm']:.1f} | "
            f"{s['files'] + s['openblas']:.1f} | {s['heap']:.1f} | {s['anon']:.1f} | "
            f"{s.get('numpy_traced', float('nan')):.1f} |"
        )
        prev = s["VmRSS"]
    if peak:
        print()
        print(f"At the peak ({peak['peak']:.1f} MiB sampled, VmHWM {peak['VmHWM']:.1f}; {peak['at']}), per mapping:")
        print()
        print("| mapping | resident MiB |")
        print("|---|---|")
        rest = 0.0
        for name, mib in peak["mappings"]:
            if mib >= 0.5:
                print(f"| {name} | {mib:.1f} |")
            else:
                rest += mib
        print(f"| everything else (each under 0.5) | {rest:.1f} |")
    print()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "stages": stages, "peak": peak, "load": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
