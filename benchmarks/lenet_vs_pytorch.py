"""LeNet training step: minicaffe vs PyTorch (CPU), side by side, in one run.

    python benchmarks/lenet_vs_pytorch.py [--threads 1 2] [--steps 200] [--warmup 30] [--compile]

The same net (Caffe's LeNet: conv 20 5x5, max pool, conv 50 5x5, max pool, ip 500, ReLU, ip 10,
softmax loss), the same solver (SGD, momentum 0.9, weight decay 5e-4, lr policy inv), batch 64 of
real MNIST (scaled by 1/256), the same number of threads. Each framework runs in its own fresh
subprocess (so thread settings apply from the start and peak memory is its own): it warms up, then
times ``--steps`` full training steps (forward, backward, update), and reports the median step
time, the spread, and its peak resident memory (VmHWM). The table gives minicaffe / PyTorch.

PyTorch is a benchmark-only dependency: ``pip install -e ".[bench]"`` (torch==2.13.0, CPU build).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def mnist_batches(batch, steps):
    from minicaffe.data import load_mnist

    images, labels = load_mnist()["train"]
    n = batch * steps
    idx = __import__("numpy").arange(n) % len(images)
    return images[idx], labels[idx]


def run_minicaffe(steps, warmup):
    import minicaffe as caffe

    caffe.set_random_seed(1)
    solver = caffe.get_solver(os.path.join(ROOT, "nets", "lenet_solver.prototxt"), log=lambda m: None)
    solver.param.test_interval = 0
    solver.param.display = 0
    solver.param.snapshot = 0
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        solver.step(1)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times, float(solver.smoothed_loss)


def run_torch(steps, warmup, compile_=False):
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(1)

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

    model = LeNet()
    step_model = torch.compile(model) if compile_ else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
    images, labels = mnist_batches(64, warmup + steps)
    x_all = torch.from_numpy(images.astype(np.float32) / 256.0)
    y_all = torch.from_numpy(labels.astype(np.int64))
    times = []
    loss = None
    for i in range(warmup + steps):
        t = time.perf_counter()
        x, y = x_all[64 * i : 64 * (i + 1)], y_all[64 * i : 64 * (i + 1)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times, float(loss)


def child(args):
    if args.framework == "minicaffe":
        times, loss = run_minicaffe(args.steps, args.warmup)
    else:
        times, loss = run_torch(args.steps, args.warmup, args.framework == "torch.compile")
    print(json.dumps({"times": times, "loss": loss, "peak_mib": peak_rss_mib()}))


def spawn(framework, threads, steps, warmup):
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        NUMBA_NUM_THREADS=str(threads),
    )
    if framework.startswith("torch"):
        env["TORCH_NUM_THREADS"] = str(threads)
    code = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        framework,
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--threads",
        str(threads),
    ]
    out = subprocess.run(code, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{framework} with {threads} thread(s) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.framework = args.child
        if args.framework.startswith("torch"):
            import torch

            torch.set_num_threads(args.threads[0])
        return child(args)
    import numba
    import numpy

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        raise SystemExit("PyTorch is not installed: pip install -e '.[bench]' (torch==2.13.0, CPU build)") from None
    print(
        f"LeNet training step, batch 64, real MNIST; {args.warmup} warm-up + {args.steps} timed steps; "
        f"numpy {numpy.__version__}, numba {numba.__version__}, torch {torch_version}, {os.cpu_count()} cpus"
    )
    frameworks = ["minicaffe", "torch"] + (["torch.compile"] if args.compile else [])
    results = []
    print(f"{'framework':<14} {'threads':>7} {'median ms':>10} {'p10-p90 ms':>14} {'peak MiB':>9} {'vs torch':>9}")
    for threads in args.threads:
        row = {}
        for fw in frameworks:
            r = spawn(fw, threads, args.steps, args.warmup)
            ts = sorted(r["times"])
            r.update(
                framework=fw,
                threads=threads,
                median_ms=1000 * statistics.median(ts),
                p10_ms=1000 * ts[len(ts) // 10],
                p90_ms=1000 * ts[(9 * len(ts)) // 10],
            )
            row[fw] = r
            results.append({k: v for k, v in r.items() if k != "times"})
        for fw in frameworks:
            r = row[fw]
            ratio = r["median_ms"] / row["torch"]["median_ms"]
            print(
                f"{fw:<14} {threads:>7} {r['median_ms']:>10.2f} {r['p10_ms']:>6.2f}-{r['p90_ms']:<7.2f} "
                f"{r['peak_mib']:>9.0f} {ratio:>8.2f}x"
            )
    print("vs torch = median step time / PyTorch eager's at the same thread count (< 1: minicaffe faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
