"""LeNet training step on a GPU: minicaffe's cuda backend vs PyTorch eager vs PyTorch CUDA graph,
side by side, in one run on the same GPU.

    python benchmarks/gpu_step.py [--batch 64 1024] [--steps 200] [--warmup 30] [--out FILE.json]

The same net (Caffe's LeNet: conv 20 5x5, max pool, conv 50 5x5, max pool, ip 500, ReLU, ip 10,
softmax loss), the same update (SGD, momentum 0.9, weight decay 5e-4), synthetic data made once on
the device (so the timing is the step, not the input pipeline).  Each contender warms up past
compilation, then times ``--steps`` steps, synchronizing the device after each one; the median
and the spread are reported, and the ratio to PyTorch eager.

* minicaffe: ``net.forward_backward()`` plus the backend's fused ``sgd_step`` kernel per
  parameter: exactly what ``Solver.step`` runs on the GPU, less the logging;
* PyTorch eager: the same step with ``torch.optim.SGD``;
* PyTorch CUDA graph: that step captured once with ``torch.cuda.graphs`` and replayed (the
  floor of launch overhead this GPU allows).

A batch that does not change the step time means the step is launch overhead, not arithmetic.
Without a GPU (no CuPy, no device) or without PyTorch it prints why and exits 0: there is
nothing to measure.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def why_not():
    """None if this machine can run the benchmark, else why not."""
    from minicaffe import backend

    reason = backend.why_not("cuda")
    if reason is not None:
        return f"the cuda backend cannot run here: {reason}"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the comparison needs it: pip install torch, a CUDA build)"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device (a CPU-only build of torch?)"
    return None


def lenet_text(batch):
    with open(os.path.join(ROOT, "nets", "lenet.prototxt")) as f:
        text = f.read().replace("dim: 64", f"dim: {batch}")
    head, _, _ = text.rpartition('layer { name: "prob"')
    return head + (
        f'layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {batch} }} }} }}\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }\n'
    )


def timed(step, sync, steps, warmup):
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    return times


def bench_minicaffe(batch, steps, warmup):
    import numpy as np

    import minicaffe as caffe
    from minicaffe import backend

    gpu = backend.get("cuda")
    net = caffe.Net(lenet_text(batch), caffe.TRAIN, backend=gpu)
    rng = np.random.default_rng(0)
    net.blobs["data"].data = rng.uniform(0, 1, net.blobs["data"].shape).astype(np.float32)
    net.blobs["label"].data = rng.integers(0, 10, batch).astype(np.float32)
    hist = [gpu.xp.zeros_like(p.dev_flat_data) for p in net.learnable_params]
    params = net.learnable_params

    def step():
        net.clear_param_diffs()
        net.forward_backward()
        for p, h in zip(params, hist):
            gpu.sgd_step(p.dev_flat_data, p.dev_flat_diff, h, 0.9, 0.01, 5e-4)

    gpu.transfers.reset()
    times = timed(step, gpu.synchronize, steps, warmup)
    t = gpu.transfers.snapshot()
    return times, f"transfers per step: {t['h2d'] / (steps + warmup):.2f} h2d, {t['d2h'] / (steps + warmup):.2f} d2h"


def torch_lenet(batch):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 20, 5),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(20, 50, 5),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(800, 500),
        nn.ReLU(),
        nn.Linear(500, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.rand(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()
    return model, opt, x, y, loss_fn


def bench_torch_eager(batch, steps, warmup):
    import torch

    model, opt, x, y, loss_fn = torch_lenet(batch)

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()

    return timed(step, torch.cuda.synchronize, steps, warmup), ""


def bench_torch_graph(batch, steps, warmup):
    import torch

    model, opt, x, y, loss_fn = torch_lenet(batch)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on a side stream before capture, as PyTorch's docs say
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return timed(g.replay, torch.cuda.synchronize, steps, warmup), ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--out", help="write the results as JSON here too")
    args = ap.parse_args(argv)
    reason = why_not()
    if reason is not None:
        print(f"gpu_step: nothing to measure on this machine: {reason}")
        return 0
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    rows = []
    for batch in args.batch:
        results = {}
        for name, fn in (
            ("minicaffe (cuda)", bench_minicaffe),
            ("PyTorch eager", bench_torch_eager),
            ("PyTorch CUDA graph", bench_torch_graph),
        ):
            times, note = fn(batch, args.steps, args.warmup)
            ms = [t * 1e3 for t in times]
            results[name] = (statistics.median(ms), min(ms), max(ms), note)
        base = results["PyTorch eager"][0]
        print(f"\nLeNet training step, batch {batch}, median of {args.steps} (ms):")
        print(f"| {'':20} | median ms | min | max | / PyTorch eager | note |")
        print("|---|---|---|---|---|---|")
        for name, (med, lo, hi, note) in results.items():
            print(f"| {name:20} | {med:.3f} | {lo:.3f} | {hi:.3f} | {med / base:.2f} | {note} |")
            rows.append({"batch": batch, "who": name, "median_ms": med, "min_ms": lo, "max_ms": hi, "note": note})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
