"""A training step of LeNet and CIFAR-10 quick: minicaffe's configurations vs PyTorch (CPU), in one run.

    python benchmarks/lenet_vs_pytorch.py                      # both nets, every configuration, 3 rounds
    python benchmarks/lenet_vs_pytorch.py --nets lenet --rounds 5 --steps 100 --json out.json

The same nets (Caffe's LeNet: conv 20 5x5, max pool, conv 50 5x5, max pool, ip 500, ReLU, ip 10,
softmax loss, batch 64 of real MNIST scaled by 1/256; Caffe's CIFAR-10 quick: three 5x5 convs of
32, 32, 64 with max and average pooling (Caffe's ceil rounding), ip 64, ip 10, batch 100 of
synthetic 3x32x32 images) and the same solver (SGD with momentum and weight decay, Caffe's lr
policy) in every framework.  Each configuration runs in a fresh subprocess of its own (thread
settings apply from the start, peak memory is its own): it warms up past compilation (numba's,
torch.compile's), then times ``--steps`` full training steps (forward, backward, update) and
reports the median step.  The configurations run in ``--rounds`` interleaved rounds (a, b, c, a,
b, c, ...), so a slow minute on a shared machine hits all of them; the table gives the median over
rounds of each configuration's median step, its ratio to torch.compile with 2 threads, and its peak
resident memory (VmHWM).  The load average is printed before and after.

Configurations (T = the machine's cores, 2 on the machine of docs/CPU_SPEED.md):
  minicaffe 1 thread          the Solver, one lane, OpenBLAS 1 thread
  minicaffe BLAS xT           the Solver, one lane, OpenBLAS T threads (Caffe's way)
  minicaffe lanes xT          the Solver, T lanes, BLAS 1 thread per lane (what ``python -m
                              minicaffe.train`` does): the step plan runs LeNet's conv1 .. relu1
                              (CIFAR-10 quick's conv1 .. ip1) as one task per lane forward and one
                              backward (minicaffe/parallel/plan.py)
  minicaffe lanes xT, by layer the same without the step plan: each conv/ip/pool call split over
                              the T lanes on its own (one hand-off per layer call)
  minicaffe --workers T       SingleCaffe: T worker threads + the server thread, BLAS 1 thread
  torch eager 1 / T threads   PyTorch, ``torch.set_num_threads``
  torch.compile T threads     the model compiled once (inductor, C++ on the CPU)
  torch.compile T threads,    the same with OMP_WAIT_POLICY=ACTIVE: PyTorch's OpenMP threads spin
    OMP spinning              between parallel regions instead of going to sleep.  On a 2-core
                              machine PyTorch's step is bimodal (about 10 ms when its worker thread
                              is awake when work arrives, 13-16 ms when it must be woken), and the
                              default policy lands in either from one run to the next; spinning
                              was faster in some runs and slower in others (docs/CPU_SPEED.md),
                              so the ratios stay against the default row
  caffe time 1 / T threads    with ``--caffe BIN`` (or a ``caffe`` on PATH): BVLC Caffe's own
                              ``caffe time`` on the same net (its Data layers replaced by an
                              Input layer of the batch's shape; Caffe zero-fills it), OpenBLAS 1 /
                              T threads.  ``caffe time`` runs forward + backward and no update,
                              and reports the mean of ``--steps`` iterations, not the median: a
                              little less work than the other rows, said in the row's label

PyTorch is a benchmark-only dependency: ``pip install -e ".[bench]"`` (torch==2.13.0, CPU build).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOLVERS = {"lenet": "lenet_solver.prototxt", "cifar10_quick": "cifar10_quick_solver.prototxt"}
BATCH = {"lenet": 64, "cifar10_quick": 100}


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def mnist_batches(batch, steps):
    import numpy as np

    from minicaffe.data import load_mnist

    images, labels = load_mnist()["train"]
    idx = np.arange(batch * steps) % len(images)
    return images[idx], labels[idx]


# -- minicaffe ---------------------------------------------------------------------------------------
def minicaffe_solver(net):
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.solvers import get_solver, load_solver_param

    caffe.set_random_seed(1)
    param, base = load_solver_param(os.path.join(ROOT, "nets", SOLVERS[net]))
    if net != "lenet":  # LeNet reads real MNIST; CIFAR-10 is not downloaded here: same shapes, synthetic
        netp = proto.parse_file(os.path.join(ROOT, "nets", param.net), "NetParameter")
        param.clear("net")
        param.net_param = with_synthetic_data(netp, count=2000)
    for f in ("test_iter", "test_interval"):
        param.clear(f)
    param.display = 0
    param.snapshot = 0
    param.snapshot_after_train = False
    return get_solver(param, base_dir=os.path.join(ROOT, "nets"), log=lambda m: None)


def run_minicaffe(net, cfg, steps, warmup):
    from minicaffe.parallel import ParallelTrainer, blas, lanes, plan

    solver = minicaffe_solver(net)
    lanes.set_count(cfg.get("lanes", 1))
    plan.set_enabled(cfg.get("plan", True))
    blas.set_threads(cfg.get("blas", 1))
    if cfg.get("workers"):
        trainer = ParallelTrainer(solver, cfg["workers"], blas_threads=cfg.get("blas", 1))
        step = trainer.step
    else:
        step = solver.step
    step(warmup)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(1)
        times.append(time.perf_counter() - t)
    return times, float(solver.smoothed_loss)


# -- PyTorch -------------------------------------------------------------------------------------------
def torch_model(net):
    import torch.nn as nn
    import torch.nn.functional as F

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 20, 5)
            self.conv2 = nn.Conv2d(20, 50, 5)
            self.ip1 = nn.Linear(800, 500)
            self.ip2 = nn.Linear(500, 10)

        def forward(self, x):
            x = F.max_pool2d(self.conv1(x), 2, 2)
            x = F.max_pool2d(self.conv2(x), 2, 2)
            x = F.relu(self.ip1(x.flatten(1)))
            return self.ip2(x)

    class CifarQuick(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 5, padding=2)
            self.conv2 = nn.Conv2d(32, 32, 5, padding=2)
            self.conv3 = nn.Conv2d(32, 64, 5, padding=2)
            self.ip1 = nn.Linear(64 * 4 * 4, 64)
            self.ip2 = nn.Linear(64, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 3, 2, ceil_mode=True))
            x = F.avg_pool2d(F.relu(self.conv2(x)), 3, 2, ceil_mode=True)
            x = F.avg_pool2d(F.relu(self.conv3(x)), 3, 2, ceil_mode=True)
            return self.ip2(self.ip1(x.flatten(1)))

    return LeNet() if net == "lenet" else CifarQuick()


def run_torch(net, cfg, steps, warmup):
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(1)
    model = torch_model(net)
    step_model = torch.compile(model) if cfg.get("compile") else model
    b = BATCH[net]
    if net == "lenet":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
        images, labels = mnist_batches(b, warmup + steps)
        x_all = torch.from_numpy(images.astype(np.float32) / 256.0)
        y_all = torch.from_numpy(labels.astype(np.int64))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, weight_decay=4e-3)
        sched = None
        g = np.random.default_rng(1)
        n = 20 * b
        x_all = torch.from_numpy(g.standard_normal((n, 3, 32, 32)).astype(np.float32))
        y_all = torch.from_numpy(g.integers(0, 10, n).astype(np.int64))
    times, loss = [], None
    for i in range(warmup + steps):
        t = time.perf_counter()
        j = (i * b) % len(x_all)
        x, y = x_all[j : j + b], y_all[j : j + b]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times, float(loss)


# -- BVLC Caffe's caffe time ------------------------------------------------------------------------------
def caffe_time_model(net, path):
    """Write the net's TRAIN phase for ``caffe time`` to ``path``: its Data layers replaced by one
    Input layer of the same tops and shapes (``caffe time`` needs no database then)."""
    from minicaffe import proto

    param, _ = load_solver_param_for(net)
    netp = proto.parse_file(os.path.join(ROOT, "nets", param.net), "NetParameter")
    shape = (BATCH[net], 1, 28, 28) if net == "lenet" else (BATCH[net], 3, 32, 32)
    dims = " ".join(f"dim: {d}" for d in shape)
    text = [
        f'name: "{netp.name}"',
        f'layer {{ name: "data" type: "Input" top: "data" top: "label" '
        f"input_param {{ shape {{ {dims} }} shape {{ dim: {shape[0]} }} }} }}",
    ]
    for lp in netp.layer:
        if lp.type == "Data" or any(r.phase == "TEST" for r in lp.include):
            continue
        lp.clear("include")
        text.append("layer {\n" + proto.to_text(lp, indent=1) + "}")
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")


def load_solver_param_for(net):
    from minicaffe.solvers import load_solver_param

    return load_solver_param(os.path.join(ROOT, "nets", SOLVERS[net]))


def run_caffe(net, cfg, steps, warmup):
    """``caffe time -model <net> -iterations <steps>`` in a child; its mean Forward-Backward."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, f"{net}_time.prototxt")
        caffe_time_model(net, model)
        out = subprocess.run(
            [cfg["binary"], "time", "-model", model, "-iterations", str(steps)],
            capture_output=True,
            text=True,
            env=dict(os.environ, GLOG_logtostderr="1"),
        )
    text = out.stdout + out.stderr
    m = re.search(r"Average Forward-Backward: ([0-9.]+) ms", text)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"caffe time failed (exit {out.returncode}):\n{text[-3000:]}")
    return [float(m.group(1)) / 1000.0], float("nan")


def children_peak_mib():
    """The peak resident memory of the largest child process that has ended (caffe's)."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


# -- the driver ------------------------------------------------------------------------------------------
def configurations(cores, caffe=None):
    t = cores
    extra = []
    if caffe:
        extra = [
            ("caffe time 1 thread (fwd+bwd, no update)", {"fw": "caffe", "binary": caffe, "threads": 1}),
            (f"caffe time {t} threads (fwd+bwd, no update)", {"fw": "caffe", "binary": caffe, "threads": t}),
        ]
    return [
        ("minicaffe 1 thread", {"fw": "minicaffe", "lanes": 1, "blas": 1}),
        (f"minicaffe BLAS x{t}", {"fw": "minicaffe", "lanes": 1, "blas": t}),
        (f"minicaffe lanes x{t}", {"fw": "minicaffe", "lanes": t, "blas": 1}),
        (f"minicaffe lanes x{t}, by layer", {"fw": "minicaffe", "lanes": t, "blas": 1, "plan": False}),
        (f"minicaffe --workers {t}", {"fw": "minicaffe", "workers": t, "blas": 1}),
        ("torch eager 1 thread", {"fw": "torch", "threads": 1}),
        (f"torch eager {t} threads", {"fw": "torch", "threads": t}),
        (f"torch.compile {t} threads", {"fw": "torch", "threads": t, "compile": True}),
        (f"torch.compile {t} threads, OMP spinning", {"fw": "torch", "threads": t, "compile": True, "omp": "ACTIVE"}),
    ] + extra


def child(net, cfg, steps, warmup):
    if cfg["fw"] == "minicaffe":
        times, loss = run_minicaffe(net, cfg, steps, warmup)
    elif cfg["fw"] == "caffe":
        times, loss = run_caffe(net, cfg, steps, warmup)
    else:
        times, loss = run_torch(net, cfg, steps, warmup)
    peak = children_peak_mib() if cfg["fw"] == "caffe" else peak_rss_mib()
    print(json.dumps({"times": times, "loss": loss, "peak_mib": peak}))


def spawn(net, cfg, steps, warmup):
    threads = cfg.get("threads") or cfg.get("blas", 1)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONPATH=ROOT,
    )
    if cfg.get("omp"):
        env["OMP_WAIT_POLICY"] = cfg["omp"]
    code = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([net, cfg, steps, warmup])]
    out = subprocess.run(code, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{net} {cfg} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", default=list(SOLVERS), choices=list(SOLVERS))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    p.add_argument("--steps", type=int, default=60, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--only", nargs="+", help="configurations whose label starts with any of these")
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--caffe",
        default=shutil.which("caffe"),
        help="BVLC Caffe's caffe binary: adds caffe time rows (default: a caffe on PATH; none: no rows)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(*json.loads(args.child))
    import numba
    import numpy

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        raise SystemExit("PyTorch is not installed: pip install -e '.[bench]' (torch==2.13.0, CPU build)") from None
    sys.path.insert(0, ROOT)
    from minicaffe.parallel import blas

    cores = blas.cores()
    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(
        f"Training step: {args.rounds} interleaved rounds x ({args.warmup} warm-up + {args.steps} timed steps) per "
        f"configuration; {model}, {cores} cores; numpy {numpy.__version__}, numba {numba.__version__}, "
        f"torch {torch_version}; load {load()} at the start"
    )
    if args.caffe:
        print(f"caffe time rows from {args.caffe}")
    cfgs = [c for c in configurations(cores, args.caffe) if not args.only or any(c[0].startswith(o) for o in args.only)]
    results = []
    for net in args.nets:
        runs = {label: [] for label, _ in cfgs}
        for _ in range(args.rounds):
            for label, cfg in cfgs:
                runs[label].append(spawn(net, cfg, args.steps, args.warmup))
        rows = {}
        for label, _ in cfgs:
            meds = [1000 * statistics.median(r["times"]) for r in runs[label]]
            rows[label] = {
                "net": net,
                "configuration": label,
                "median_ms": statistics.median(meds),
                "round_medians_ms": meds,
                "peak_mib": max(r["peak_mib"] for r in runs[label]),
                "loss": runs[label][-1]["loss"],
            }
        base = rows.get(f"torch.compile {cores} threads")
        print(f"\n{net}, batch {BATCH[net]}")
        print(f"| configuration | step ms (median) | rounds' medians ms | x torch.compile {cores} threads | peak MiB |")
        print("|---|---|---|---|---|")
        for label, _ in cfgs:
            r = rows[label]
            ratio = f"{r['median_ms'] / base['median_ms']:.2f}" if base else "-"
            spread = ", ".join(f"{m:.1f}" for m in r["round_medians_ms"])
            print(f"| {label} | {r['median_ms']:.2f} | {spread} | {ratio} | {r['peak_mib']:.0f} |")
            results.append(r)
    print(f"\nload {load()} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
