"""``python -m minicaffe.train lenet``: train a net as ``caffe train --solver=...`` does.

    python -m minicaffe.train lenet                      # nets/lenet_solver.prototxt, real MNIST
    python -m minicaffe.train path/to/solver.prototxt --iters 500 --seed 3 --output runs/x
    python -m minicaffe.train lenet --resume runs/lenet/lenet_iter_5000.solverstate
    python -m minicaffe.train lenet --weights pretrained.caffemodel   # fine-tune

Writes into the output directory (default ``runs/<name>``): snapshots (``*.caffemodel`` +
``*.solverstate``, atomically), ``train_log.json`` (every iteration's loss and lr, every test,
the versions and settings) and ``curves.png`` (train/test loss and test accuracy against
iterations and seconds).  Ctrl-C stops after the current iteration and snapshots.
"""

import argparse
import json
import os
import signal
import sys
import time

from .. import backend as _backend
from ..errors import MinicaffeError, SolverError
from ..io import atomic_write
from .common import Logger, Progress, banner, fmt_seconds, resolve_solver, versions


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("solver", help="a short name from nets/ (lenet, cifar10_quick, ...) or a solver prototxt")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where to train (default cpu)")
    p.add_argument("--iters", type=int, help="stop after this many iterations (overrides max_iter)")
    p.add_argument("--seed", type=int, help="random seed (overrides the solver's random_seed)")
    p.add_argument("--weights", help="initialize from these weights (.caffemodel or .npz)")
    p.add_argument("--resume", help="continue from a .solverstate written by a snapshot")
    p.add_argument("--output", help="output directory (default runs/<name>)")
    p.add_argument("--data-dir", help="where datasets are cached (default: $MINICAFFE_DATA or ~/.cache/minicaffe)")
    p.add_argument("--snapshot", type=int, help="snapshot every N iterations (overrides the solver)")
    p.add_argument("--test-interval", type=int, help="test every N iterations (overrides the solver; 0 = never)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="SingleCaffe: N worker threads on shards of each batch + a parameter-server thread",
    )
    p.add_argument(
        "--staleness",
        type=int,
        default=0,
        help="with --workers: bounded staleness s (SSP); 0 = synchronous (BSP, the default)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    return p


class RunRecord:
    """Everything the run measured, for train_log.json and curves.png."""

    def __init__(self, solver_path, args):
        self.t0 = time.perf_counter()
        self.data = {
            "solver": solver_path,
            "args": {k: v for k, v in vars(args).items()},
            "versions": versions(),
            "train": {"iter": [], "loss": [], "lr": [], "seconds": []},
            "test": [],
        }

    def on_iteration(self, solver, loss, lr):
        t = self.data["train"]
        t["iter"].append(solver.iter - 1)
        t["loss"].append(loss)
        t["lr"].append(lr)
        t["seconds"].append(time.perf_counter() - self.t0)

    def on_test(self, solver, index, result):
        self.data["test"].append(
            {"iter": solver.iter, "net": index, "seconds": time.perf_counter() - self.t0, "outputs": result}
        )

    def write(self, out_dir, plot=True):
        path = os.path.join(out_dir, "train_log.json")
        text = json.dumps(self.data, indent=1).encode()
        atomic_write(path, lambda f: f.write(text))
        png = os.path.join(out_dir, "curves.png") if plot else None
        if png:
            plot_curves(self.data, png)
        return path, png


def plot_curves(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = data["train"]
    tests = [t for t in data["test"] if t["net"] == 0]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for col, key, label in ((0, "iter", "iteration"), (1, "seconds", "seconds")):
        ax = axes[0][col]
        if train["iter"]:
            ax.plot(train[key], train["loss"], lw=0.5, alpha=0.35, color="C0", label="train loss")
            window = min(100, len(train["loss"]))
            if window > 1:
                import numpy as np

                smooth = np.convolve(train["loss"], np.ones(window) / window, mode="valid")
                ax.plot(train[key][window - 1 :], smooth, lw=1.5, color="C0", label=f"train loss, mean of {window}")
        if tests and "loss" in tests[0]["outputs"]:
            ax.plot([t[key] for t in tests], [t["outputs"]["loss"] for t in tests], "o-", color="C1", label="test loss")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        ax = axes[1][col]
        accs = [k for k in (tests[0]["outputs"] if tests else {}) if "acc" in k]
        for j, k in enumerate(accs):
            values = [t["outputs"][k] for t in tests]
            ax.plot([t[key] for t in tests], values, "o-", color=f"C{j + 1}", label=f"test {k}")
            if len(values) > 2:  # zoom on the end of training; the first test may fall below
                low = min(values[1:])
                ax.set_ylim(max(0.0, low - 0.1 * (1 - low) - 0.002), min(1.0, max(values) + 0.1 * (1 - low) + 0.002))
        ax.set_xlabel(label)
        ax.set_ylabel("accuracy")
        if accs:
            ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{os.path.basename(data['solver'])}")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


def last_snapshot(out_dir):
    states = [f for f in os.listdir(out_dir) if f.endswith(".solverstate")] if os.path.isdir(out_dir) else []
    if not states:
        return None
    return os.path.join(out_dir, max(states, key=lambda f: os.path.getmtime(os.path.join(out_dir, f))))


def run(args):
    from ..solvers import get_solver, load_solver_param

    solver_path = resolve_solver(args.solver)
    name = os.path.basename(solver_path).replace("_solver.prototxt", "").replace(".prototxt", "")
    out_dir = args.output or os.path.join("runs", name)
    os.makedirs(out_dir, exist_ok=True)
    if args.data_dir:
        from ..data import set_data_dir

        set_data_dir(os.path.abspath(args.data_dir))
    if args.weights and args.resume:
        raise MinicaffeError("give --weights (start from weights) or --resume (continue a run), not both")
    _backend.set_mode("gpu" if args.device == "gpu" else "cpu")

    param, base_dir = load_solver_param(solver_path)
    if args.iters is not None:
        param.max_iter = args.iters
    if args.seed is not None:
        param.random_seed = args.seed
    if args.snapshot is not None:
        param.snapshot = args.snapshot
    if args.test_interval is not None:
        param.test_interval = args.test_interval
    prefix = os.path.basename(param.snapshot_prefix or name)
    param.snapshot_prefix = os.path.join(out_dir, prefix)

    interactive = sys.stderr.isatty()
    progress = Progress(param.max_iter) if interactive else None
    log = Logger(progress=progress)
    log(f"minicaffe train: {solver_path} -> {out_dir}")
    log(banner())
    solver = get_solver(param, base_dir=base_dir, log=log)
    if args.weights:
        skipped = solver.net.copy_from(args.weights)
        log(f"Initialized from {args.weights}" + (f" (ignored layers: {', '.join(skipped)})" if skipped else ""))
    record = RunRecord(solver_path, args)
    solver.on_iteration.append(record.on_iteration)
    solver.on_test.append(record.on_test)
    if progress is not None:
        progress.t0 = time.perf_counter()
        solver.on_iteration.append(lambda s, loss, lr: progress.update(s.iter, f"loss {s.smoothed_loss:.4g}"))

    def on_sigint(signum, frame):
        if solver.requested_stop:
            raise KeyboardInterrupt
        solver.requested_stop = True
        log("Interrupted: stopping after this iteration and writing a snapshot (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    start = time.perf_counter()
    start_iter = None
    try:
        if args.workers < 1 or args.staleness < 0:
            raise MinicaffeError(f"--workers must be >= 1 and --staleness >= 0 (got {args.workers}, {args.staleness})")
        if args.resume:
            solver.restore(args.resume)
        if progress is not None:
            progress.start_done = progress.done = solver.iter
        start_iter = solver.iter
        if args.workers > 1 or args.staleness > 0:
            from ..parallel import train_with_workers

            trainer = train_with_workers(solver, args.workers, staleness=args.staleness)
            st = trainer.stats()
            ms = lambda v: f"{1000 * v:.2f}"
            log(
                f"Parallel: {st['clocks']} iterations, {ms(st['wall_per_clock'])} ms each; server: fetch "
                f"{ms(st['server_fetch'])}, wait {ms(st['server_wait'])}, reduce {ms(st['server_reduce'])}, "
                f"update {ms(st['server_update'])} ms; workers compute "
                f"{', '.join(ms(v) for v in st['worker_compute'])} ms, wait "
                f"{', '.join(ms(v) for v in st['worker_wait'])} ms"
            )
        else:
            solver.solve()
    except SolverError as exc:
        if progress is not None:
            progress.close()
        kept = last_snapshot(out_dir)
        log(f"ERROR: {exc}")
        log(f"The last good snapshot is kept: {kept}" if kept else "No snapshot had been written yet.")
        record.write(out_dir, plot=not args.no_plot)
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
        if progress is not None:
            progress.close()
    elapsed = time.perf_counter() - start
    done = solver.iter - (start_iter or 0)
    log_path, png = record.write(out_dir, plot=not args.no_plot)
    summary = (
        f"Trained {done} iterations in {elapsed:.1f} s ({fmt_seconds(elapsed)}, "
        f"{1000 * elapsed / max(done, 1):.2f} ms/iter including tests)"
    )
    log(summary)
    tests = [t for t in record.data["test"] if t["net"] == 0]
    if tests:
        final = ", ".join(f"{k} = {v:.4f}" for k, v in tests[-1]["outputs"].items() if isinstance(v, float))
        log(f"Final test (iteration {tests[-1]['iter']}): {final}")
    log(f"Log: {log_path}" + (f"  Curves: {png}" if png else ""))
    return 130 if solver.requested_stop else 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
