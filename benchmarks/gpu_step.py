"""LeNet training step on a GPU: minicaffe's cuda backend (eager, device step, CUDA-graph replay)
vs PyTorch eager vs PyTorch CUDA graph, side by side, in one run on the same GPU, with the kernel
launches of one minicaffe step.

    python benchmarks/gpu_step.py [--batch 64 1024] [--steps 200] [--warmup 30] [--out FILE.json]
    python benchmarks/gpu_step.py --count      # only the launches per step (numba's simulator: no GPU needed)

The same net (Caffe's LeNet: conv 20 5x5, max pool, conv 50 5x5, max pool, ip 500, ReLU, ip 10,
softmax loss), the same update (SGD, momentum 0.9, weight decay 5e-4), synthetic data made once on
the device (so the timing is the step, not the input pipeline).  Each contender warms up past
compilation, then times ``--steps`` steps, synchronizing the device after each one; the median
and the spread are reported, and the ratio to PyTorch eager.

* minicaffe eager: ``net.forward_backward()`` plus the backend's fused ``sgd_step`` kernel per
  parameter: what ``Solver.step`` runs on the GPU, less the logging (it waits for the host twice
  a step: the label check and the loss);
* minicaffe device step: ``solver.enable_graph("device")``'s iteration: the batch copied in,
  then a body that never waits for the host (flat parameters: one fill, one update launch);
* minicaffe CUDA graph: ``solver.enable_graph("graph")``: that body captured once on a CuPy
  stream and replayed;
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


def lenet_text(batch, narrow=False):
    """nets/lenet.prototxt at ``batch`` with labels and SoftmaxWithLoss; ``narrow``: LeNet's layers
    at reduced widths (16x16 images, 2/3 filters, 8 hidden units), for counting launches in the
    simulator, where every CUDA thread is Python (the counts do not depend on the widths)."""
    with open(os.path.join(ROOT, "nets", "lenet.prototxt")) as f:
        text = f.read().replace("dim: 64", f"dim: {batch}")
    if narrow:
        text = text.replace("dim: 28", "dim: 16").replace("num_output: 20", "num_output: 2")
        text = text.replace("num_output: 50", "num_output: 3").replace("num_output: 500", "num_output: 8")
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


def lenet_solver_text(batch, narrow=False):
    """LeNet with both Input layers in front (enable_graph's prologue feeds them)."""
    text = lenet_text(batch, narrow)
    label = f'layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {batch} }} }} }}\n'
    text = text.replace(label, "")
    cut = text.index('layer {\n  name: "conv1"')
    return text[:cut] + label + text[cut:]


def make_solver(backend_name, batch, mode, narrow=False):
    import tempfile

    import numpy as np

    import minicaffe as caffe
    from minicaffe import backend

    be = backend.get(backend_name)
    d = tempfile.mkdtemp(prefix="gpu_step_")
    with open(os.path.join(d, "lenet.prototxt"), "w") as f:
        f.write(lenet_solver_text(batch, narrow))
    with open(os.path.join(d, "solver.prototxt"), "w") as f:
        f.write(
            'net: "lenet.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 5e-4\nlr_policy: "fixed"\n'
            "display: 0\nrandom_seed: 1\n"
        )
    solver = caffe.SGDSolver(os.path.join(d, "solver.prototxt"), log=lambda m: None, backend=be)
    rng = np.random.default_rng(0)
    solver.net.blobs["data"].data = rng.uniform(0, 1, solver.net.blobs["data"].shape).astype(np.float32)
    solver.net.blobs["label"].data = rng.integers(0, 10, batch).astype(np.float32)
    step = solver.enable_graph(mode)
    return be, solver, step


def bench_minicaffe_mode(mode):
    def bench(batch, steps, warmup):
        be, solver, step = make_solver("cuda", batch, mode)
        be.transfers.reset()
        times = timed(lambda: step.iteration(0.01), be.synchronize, steps, warmup)
        t = be.transfers.snapshot()
        n = steps + warmup
        return times, f"transfers per step: {t['h2d'] / n:.2f} h2d, {t['d2h'] / n:.2f} d2h"

    return bench


def count_launches(batch=2):
    """Launches of one LeNet iteration on the GPU path, counted in numba's simulator (in a fresh
    process: numba picks real-or-simulator once per process): numba kernels + the array
    operations that are each one kernel on a GPU; for the eager step and enable_graph's body."""
    import subprocess

    code = (
        f"import json, sys; sys.path.insert(0, {ROOT!r}); from benchmarks.gpu_step import _count_here; "
        f"print('COUNT ' + json.dumps(_count_here({int(batch)})))"
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    line = [l for l in r.stdout.splitlines() if l.startswith("COUNT ")]
    if not line:
        raise RuntimeError("counting launches in the simulator failed:\n" + r.stderr[-3000:])
    return json.loads(line[-1][6:])


def _count_here(batch):
    from kernels.cuda import _launch

    L = _launch.launcher()
    out = {}
    for mode in ("eager", "device"):
        be, solver, step = make_solver("cudasim", batch, "device", narrow=True)
        if mode == "eager":
            solver.disable_graph()
            net, hist = solver.net, [be.xp.zeros_like(p.dev_flat_data) for p in solver.net.learnable_params]

            def run():
                net.clear_param_diffs()
                net.forward_backward()
                for p, h in zip(net.learnable_params, hist):
                    be.sgd_step(p.dev_flat_data, p.dev_flat_diff, h, 0.9, 0.01, 5e-4)
        else:

            def run():
                step.iteration(0.01)

        run()  # uploads, scratch
        L.launches.reset()
        run()
        c = L.launches.snapshot()
        out[mode] = {"numba kernels": c["kernels"], "array ops": c["xp_ops"], "host waits": c["host_syncs"]}
    return out


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


def print_counts(counts, rows):
    print("\nKernel launches per LeNet training iteration (counted in numba's simulator: numba kernels,")
    print("and the array operations that are one CuPy/cuBLAS kernel each on a GPU):")
    print("| step | numba kernels | array ops | total | host waits |")
    print("|---|---|---|---|---|")
    for mode, label in (("eager", "eager (Solver.step's)"), ("device", "enable_graph body + prologue")):
        c = counts[mode]
        waits = sum(c["host waits"]) if isinstance(c["host waits"], list) else c["host waits"]
        total = c["numba kernels"] + c["array ops"]
        print(f"| {label} | {c['numba kernels']} | {c['array ops']} | {total} | {waits} |")
        rows.append({"launches": mode, **c})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--out", help="write the results as JSON here too")
    ap.add_argument("--count", action="store_true", help="only count the launches per step (simulator)")
    args = ap.parse_args(argv)
    rows = []
    if args.count:
        print_counts(count_launches(), rows)
        return 0
    reason = why_not()
    if reason is not None:
        print(f"gpu_step: nothing to measure on this machine: {reason}")
        print("(python benchmarks/gpu_step.py --count counts the launches per step in numba's simulator)")
        return 0
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    try:
        print_counts(count_launches(), rows)
    except Exception as e:  # the timing matters more than the count: report and go on
        print(f"(launch count failed: {type(e).__name__}: {e})")
    for batch in args.batch:
        results = {}
        for name, fn in (
            ("minicaffe eager", bench_minicaffe),
            ("minicaffe device step", bench_minicaffe_mode("device")),
            ("minicaffe CUDA graph", bench_minicaffe_mode("graph")),
            ("PyTorch eager", bench_torch_eager),
            ("PyTorch CUDA graph", bench_torch_graph),
        ):
            try:
                times, note = fn(batch, args.steps, args.warmup)
            except Exception as e:  # one contender failing must not hide the others' figures
                print(f"{name}, batch {batch}: FAILED: {type(e).__name__}: {str(e)[-500:]}")
                continue
            ms = [t * 1e3 for t in times]
            results[name] = (statistics.median(ms), min(ms), max(ms), note)
        base = results.get("PyTorch eager", (float("nan"),))[0]
        graph = results.get("PyTorch CUDA graph", (float("nan"),))[0]
        print(f"\nLeNet training step, batch {batch}, median of {args.steps} (ms):")
        print(f"| {'':22} | median ms | min | max | / PyTorch eager | / PyTorch graph | note |")
        print("|---|---|---|---|---|---|---|")
        for name, (med, lo, hi, note) in results.items():
            print(f"| {name:22} | {med:.3f} | {lo:.3f} | {hi:.3f} | {med / base:.2f} | {med / graph:.2f} | {note} |")
            rows.append({"batch": batch, "who": name, "median_ms": med, "min_ms": lo, "max_ms": hi, "note": note})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
