"""``python -m minicaffe.train lenet``: train a net as ``caffe train --solver=...`` does.

    python -m minicaffe.train lenet                      # nets/lenet_solver.prototxt, real MNIST
    python -m minicaffe.train path/to/solver.prototxt --iters 500 --seed 3
    python -m minicaffe.train lenet --resume runs/lenet/latest          # continue the last run
    python -m minicaffe.train lenet --weights pretrained.caffemodel    # fine-tune
    python -m minicaffe.train lenet --output runs/mine --force          # reuse a directory

Each run gets a directory of its own, runs/<name>/<date>-<time>/ (runs/<name>/latest points to
the newest); --output DIR names it instead (refused if DIR holds files, unless --force).
Nothing is written until the nets are built and the weights or state are loaded, so a run that
cannot start leaves nothing behind.  A run directory holds the snapshots (<prefix>_iter_N.caffemodel
+ .solverstate, written atomically), train_log.jsonl (one JSON record per line, appended as the run
goes: each iteration's loss, lr and time, each test, each snapshot) and curves.png.  --resume
continues in the snapshot's directory, in the same log and plot.  Ctrl-C or SIGTERM stops after
the current iteration, writes a snapshot and prints the command that resumes the run.
"""

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
import zipfile

import numpy as np

from .. import backend as _backend
from ..dist import launch as dist
from ..errors import MinicaffeError
from ..io import atomic_write
from ..memory import jitcode, preload
from ..memory.planner import trim_heap
from ..solvers import caffe_state
from .common import Eta, Logger, Progress, banner, fmt_seconds, resolve_solver, versions

LOG_NAME = "train_log.jsonl"
PLOT_NAME = "curves.png"
TEMP_PREFIX = ".tmp-"  # what minicaffe.io.atomic_write names its temporaries
FIRST_ITERATION = "first iteration (numba compiles the kernels on a first run)"
FLUSH_SECONDS = 5.0  # the log reaches the disk at least this often (and at every display line)


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.train",
        allow_abbrev=False,  # flags are spelled out, so the resume command can be rebuilt from them
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("solver", help="a short name from nets/ (lenet, cifar10_quick, ...) or a solver prototxt")
    p.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        help="where to train; wins over the solver's solver_mode (default: the solver's solver_mode, else cpu)",
    )
    p.add_argument("--iters", type=int, help="stop after this many iterations (overrides max_iter)")
    p.add_argument("--seed", type=int, help="random seed (overrides the solver's random_seed)")
    p.add_argument("--weights", help="initialize from these weights (.caffemodel or .npz)")
    p.add_argument(
        "--resume",
        help="continue from a .solverstate written by a snapshot (or a run directory: its last complete snapshot)",
    )
    p.add_argument(
        "--output", help="the run directory (default: runs/<name>/<date>-<time>, linked as runs/<name>/latest)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let --output name a directory that holds files; the earlier run's snapshots, log and curves there are deleted",
    )
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
        help="with --workers or --nodes: bounded staleness s (SSP) between the worker threads or the nodes; "
        "0 = synchronous (BSP, the default)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --workers: a worker that takes longer than this for one iteration is hung; the run ends "
        "with a snapshot of the last consistent parameters (default 300; 0 = wait forever)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        help="cores each Convolution / InnerProduct / Pooling call splits its batch over (default: the cores, "
        "divided among --workers; 1 on a GPU or a distributed node); BLAS runs cores / lanes threads",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --device gpu (the cuda backend): capture each training iteration once as a CUDA graph and "
        "replay it (Solver.enable_graph; SGD with L2 decay, no gradient clipping; docs/GPU.md)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    dist.add_arguments(p)  # --nodes, --rank, --rendezvous, --dist mpi, ... (minicaffe/dist/launch.py)
    return p


# -- the run directory -----------------------------------------------------------------------------
SNAPSHOT_RE = re.compile(r"^(?P<prefix>.+)_iter_(?P<iter>\d+)\.solverstate$")


def snapshots(out_dir):
    """[(iteration, state path)] of the complete snapshots in ``out_dir``, oldest first.

    Complete means: not a temporary of an interrupted write (``.tmp-*``), its ``.caffemodel`` is
    there, and the state is a whole zip archive holding its record.  A crash in the middle of a
    snapshot leaves only a temporary, which is never chosen.
    """
    if not os.path.isdir(out_dir):
        return []
    found = []
    for f in os.listdir(out_dir):
        m = SNAPSHOT_RE.match(f)
        if not m or f.startswith(TEMP_PREFIX):
            continue
        path = os.path.join(out_dir, f)
        weights = os.path.join(out_dir, f"{m['prefix']}_iter_{m['iter']}.caffemodel")
        if os.path.isfile(weights) and _complete_state(path):
            found.append((int(m["iter"]), path))
    return sorted(found)


def _complete_state(path):
    try:
        with zipfile.ZipFile(path) as z:
            return "record.npy" in z.namelist() and z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return caffe_state.is_complete_caffe_state(path)  # Caffe's SolverState (snapshot_format: BINARYPROTO)


def last_snapshot(out_dir):
    """The state file of the newest complete snapshot in ``out_dir``, or None."""
    found = snapshots(out_dir)
    return found[-1][1] if found else None


def clean_temporaries(out_dir, log):
    """Delete the temporaries an interrupted snapshot or log write left in ``out_dir``."""
    if not os.path.isdir(out_dir):
        return
    for f in sorted(os.listdir(out_dir)):
        if f.startswith(TEMP_PREFIX):
            os.unlink(os.path.join(out_dir, f))
            log(f"Removed {f}: the temporary of a write that did not finish (a crash or a kill)")


def run_files(out_dir):
    """The files of a run minicaffe wrote in ``out_dir`` (what --force deletes)."""
    if not os.path.isdir(out_dir):
        return []
    ours = re.compile(r".+_iter_\d+\.(caffemodel|solverstate)$")
    return sorted(
        f
        for f in os.listdir(out_dir)
        if f in (LOG_NAME, PLOT_NAME, "train_log.json") or ours.match(f) or f.startswith(TEMP_PREFIX)
    )


def new_run_dir(base):
    """runs/<name>/<YYYYmmdd-HHMMSS>[-k]: created here (mkdir is atomic), never an existing one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(base, exist_ok=True)
    for k in range(1, 1000):
        path = os.path.join(base, stamp if k == 1 else f"{stamp}-{k}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise MinicaffeError(f"cannot create a new run directory in {base}")


def link_latest(base, run_dir):
    """runs/<name>/latest -> the newest run directory (a relative symlink, replaced atomically)."""
    link = os.path.join(base, "latest")
    if os.path.lexists(link) and not os.path.islink(link):
        return  # a real file or directory called 'latest': leave it alone
    tmp = os.path.join(base, f".latest-{os.getpid()}")
    try:
        os.symlink(os.path.relpath(run_dir, base), tmp)
        os.replace(tmp, link)
    except OSError:  # a file system without symlinks: the runs are still there, only unlinked
        if os.path.lexists(tmp):
            os.unlink(tmp)


def describe_file(path):
    """What a file given on the command line is: 'missing', 'directory', 'solverstate',
    'npz' (weights), 'caffemodel' or 'other', from its first bytes, not its name."""
    if not os.path.lexists(path):
        return "missing"
    if os.path.isdir(path):
        return "directory"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return "other"
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as z:
                return "solverstate" if "record.npy" in z.namelist() else "npz"
        except (OSError, zipfile.BadZipFile):
            return "npz"
    if path.endswith(".caffemodel") or (head and head[0] in (0x0A, 0x12)):
        return "caffemodel"
    if caffe_state.is_complete_caffe_state(path):  # a SolverState Caffe (or snapshot_format: BINARYPROTO) wrote
        return "solverstate"
    return "other"


def check_weights_arg(path):
    kind = describe_file(path)
    if kind == "missing":
        raise MinicaffeError(f"--weights: no such file: {path}")
    if kind == "directory":
        raise MinicaffeError(f"--weights: {path} is a directory; give a .caffemodel or .npz file")
    if kind == "solverstate":
        raise MinicaffeError(
            f"--weights: {path} is a solver state, not weights. To continue that run: --resume {path}; "
            f"to start a new run from its weights: --weights {_weights_of(path)}"
        )


def resolve_resume_arg(path):
    """The state file --resume names: a .solverstate, or a run directory's newest complete one."""
    kind = describe_file(path)
    if kind == "directory":
        state = last_snapshot(path)
        if state is None:
            raise MinicaffeError(f"--resume: the directory {path} holds no complete snapshot to continue from")
        return state
    if kind == "missing":
        directory = os.path.dirname(path) or "."
        found = snapshots(directory)
        hint = f"; snapshots in {directory}: {', '.join(os.path.basename(p) for _, p in found)}" if found else ""
        raise MinicaffeError(f"--resume: no such file: {path}{hint}")
    if kind in ("npz", "caffemodel"):
        raise MinicaffeError(
            f"--resume: {path} holds weights, not a solver state (a .solverstate written with it). "
            f"To start a new run from these weights: --weights {path}"
        )
    if kind != "solverstate":
        raise MinicaffeError(f"--resume: {path} is not a minicaffe solver state (.solverstate)")
    return path


def _same_dir(a, b):
    return os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)


def _weights_of(state_path):
    m = SNAPSHOT_RE.match(os.path.basename(state_path))
    if m:
        return os.path.join(os.path.dirname(state_path), f"{m['prefix']}_iter_{m['iter']}.caffemodel")
    return "<the .caffemodel beside it>"


# -- the log: JSON lines, appended as the run goes -------------------------------------------------
def read_log(path):
    """A train_log.jsonl (or the run directory holding it) as one dict:

    ``{"runs": [start records], "train": {"iter", "loss", "lr", "seconds": lists},
    "test": [{"iter", "net", "seconds", "outputs"}], "snapshots": [...], "end": last end record}``.
    A last line cut short by a kill is ignored.
    """
    if os.path.isdir(path):
        path = os.path.join(path, LOG_NAME)
    out = {"runs": [], "train": {"iter": [], "loss": [], "lr": [], "seconds": []}, "test": [], "snapshots": []}
    out["end"] = None
    for rec in _records(path):
        kind = rec.get("kind")
        if kind == "iter":
            for k in ("iter", "loss", "lr", "seconds"):
                out["train"][k].append(rec[k])
        elif kind == "test":
            out["test"].append({k: rec[k] for k in ("iter", "net", "seconds", "outputs")})
        elif kind == "start":
            out["runs"].append(rec)
        elif kind == "snapshot":
            out["snapshots"].append(rec)
        elif kind == "end":
            out["end"] = rec
    if out["runs"]:
        out["solver"] = out["runs"][-1]["solver"]
    return out


def _records(path):
    """The records of a train log, one JSON object per line, read line by line: a 10,000-iteration
    log (1.2 MB) read whole and parsed at once held 8 MiB of Python objects at the moment
    curves.png is drawn, one record at a time ~1 MiB.  A last line cut short by a kill (no
    newline after it) is ignored; a damaged line anywhere else is an error."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if not line.endswith(b"\n"):  # the last line, cut short by a kill: ignore it
                    return
                raise MinicaffeError(f"{path}:{i + 1}: not a JSON record; the log is damaged") from None
            yield rec


class TrainLog:
    """train_log.jsonl: one JSON record per line, written as the run goes.

    Iteration records are buffered and reach the file at every display line, every test and
    snapshot, at least every FLUSH_SECONDS, and at the end; so a run killed with ``kill -9`` keeps
    its log up to the last display line.  A resumed run keeps the records before its resume
    point and goes on from there (times continue from the last kept record).
    """

    def __init__(self, out_dir, start_record, resume_iter=None, history_from=None):
        self.path = os.path.join(out_dir, LOG_NAME)
        self.offset = 0.0
        kept = []
        source = history_from or self.path
        if resume_iter is not None and os.path.exists(source):
            for rec in _records(source):
                kind, it = rec.get("kind"), rec.get("iter", 0)
                if kind == "iter" and it < resume_iter or kind == "test" and it < resume_iter:
                    kept.append(rec)
                    self.offset = max(self.offset, rec["seconds"])
                elif kind == "start" or kind == "snapshot" and it <= resume_iter:
                    kept.append(rec)
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write(self.path, lambda f: f.write(text.encode()))
        self.f = open(self.path, "a")
        self.t0 = time.perf_counter()
        self.pending = []
        self.last_flush = self.t0
        self.write(dict(start_record, kind="start", time=time.strftime("%Y-%m-%dT%H:%M:%S")), flush=True)

    def seconds(self):
        return self.offset + time.perf_counter() - self.t0

    def write(self, record, flush=False):
        self.pending.append(json.dumps(record))
        if flush or time.perf_counter() - self.last_flush > FLUSH_SECONDS:
            self.flush()

    def flush(self):
        if self.pending and not self.f.closed:
            self.f.write("\n".join(self.pending) + "\n")
            self.f.flush()
            self.pending = []
        self.last_flush = time.perf_counter()

    def on_iteration(self, solver, loss, lr):
        display = solver.param.display
        flush = bool(display) and (solver.iter - 1) % display == 0
        self.write({"kind": "iter", "iter": solver.iter - 1, "loss": loss, "lr": lr, "seconds": self.seconds()}, flush)

    def on_test(self, solver, index, result):
        rec = {"kind": "test", "iter": solver.iter, "net": index, "seconds": self.seconds(), "outputs": result}
        self.write(rec, flush=True)

    def on_snapshot(self, solver, weights, state):
        rec = {"kind": "snapshot", "iter": solver.iter, "weights": os.path.basename(weights)}
        self.write(dict(rec, state=os.path.basename(state)), flush=True)

    def close(self, status, iteration, message=None):
        self.write({"kind": "end", "status": status, "iter": iteration, "message": message}, flush=True)
        self.f.close()


def plot_curves(data, path):
    """curves.png: train loss (raw and smoothed) and test loss/accuracy, against iterations and seconds.

    Drawn on a Figure of its own with the Agg canvas, not through pyplot: no figure manager, no
    change to the caller's backend (a notebook keeps its own), and 1.2 MiB fewer modules loaded."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = data["train"]
    tests = [t for t in data["test"] if t["net"] == 0]
    fig = Figure(figsize=(11, 7))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    for col, key, label in ((0, "iter", "iteration"), (1, "seconds", "seconds")):
        ax = axes[0][col]
        if train["iter"]:
            ax.plot(*min_max_decimate(train[key], train["loss"]), lw=0.5, alpha=0.35, color="C0", label="train loss")
            window = min(100, len(train["loss"]))
            if window > 1:
                smooth = np.convolve(train["loss"], np.ones(window) / window, mode="valid")
                ax.plot(
                    *min_max_decimate(train[key][window - 1 :], smooth),
                    lw=1.5,
                    color="C0",
                    label=f"train loss, mean of {window}",
                )
        if tests and "loss" in tests[0]["outputs"]:
            ax.plot([t[key] for t in tests], [t["outputs"]["loss"] for t in tests], "o-", color="C1", label="test loss")
        if ax.lines:
            ax.set_yscale("log")
            ax.legend()
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        for start in data.get("runs", [])[1:]:  # where a resumed run took over
            if start.get("resumed_at") is not None and key == "iter":
                ax.axvline(start["resumed_at"], color="0.6", lw=0.8, ls="--")
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
    fig.suptitle(os.path.basename(data.get("solver", "")))
    fig.tight_layout()
    png = fig_bytes(fig)
    atomic_write(path, lambda f: f.write(png))


def min_max_decimate(x, y, buckets=500):
    """At most 2 points per bucket of consecutive points: each bucket's lowest and highest, in
    order.  A line drawn through them covers the same pixels as the full line on a plot narrower
    than ``buckets`` pixels (each of curves.png's four plots is 436 wide), with a fraction of the
    memory and time for a long run's 10,000 iterations (drawing it took 13.3 MiB with 1,000
    buckets, 10.4 with 500)."""
    import numpy as np

    x, y = np.asarray(x), np.asarray(y)
    if len(y) <= 2 * buckets:
        return x, y
    edges = np.linspace(0, len(y), buckets + 1).astype(np.int64)
    keep = []
    for a, b in zip(edges[:-1], edges[1:]):
        lo, hi = a + int(np.argmin(y[a:b])), a + int(np.argmax(y[a:b]))
        keep += [lo, hi] if lo < hi else [hi, lo] if hi < lo else [lo]
    return x[keep], y[keep]


def fig_bytes(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


# -- settings --------------------------------------------------------------------------------------
def choose_device(args, param, solver_path, log):
    """--device wins over the solver file's solver_mode (as `caffe train --gpu` does); without the
    flag the file decides, and a file asking for a GPU where there is none falls back to the CPU
    with a note (Caffe would stop; minicaffe's nets/ come from Caffe's, which ask for a GPU)."""
    if args.device:
        device, why = args.device, "--device"
        if param.has("solver_mode") and param.solver_mode.lower() != device:
            why += f"; the solver's solver_mode: {param.solver_mode} is overridden"
    elif param.solver_mode == "GPU":
        reason = _backend.why_not("gpu")
        if reason is None:
            device, why = "gpu", f"solver_mode: GPU in {os.path.basename(solver_path)}"
        else:
            device = "cpu"
            why = f"solver_mode: GPU in {os.path.basename(solver_path)}, but no GPU here: {reason}"
    else:
        device = "cpu"
        why = f"solver_mode: CPU in {os.path.basename(solver_path)}" if param.has("solver_mode") else "the default"
    _backend.set_mode(device)
    log(f"Device: {device} ({why})")
    return device


def resume_command(argv, state):
    """The command line that continues this run from ``state``: the run's own arguments, less
    --resume/--weights/--output/--force (the run continues in the state's directory), plus
    ``--resume state``."""
    drop_with_value, drop = ("--resume", "--weights", "--output"), ("--force",)
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in drop_with_value:
            skip = True
        elif word in drop or word.split("=", 1)[0] in drop_with_value:
            continue
        else:
            words.append(word)
    return shlex.join(["python", "-m", "minicaffe.train", *words, "--resume", state])


def fetch_first(param, base_dir, progress, log):
    """Fetch MNIST before the nets are built when they read it and it is not here yet, so the
    progress line can say so (the download and conversion take a while, once)."""
    from .. import data
    from ..data import mnist
    from ..net import load_net_param
    from ..solvers.solver import resolve_path

    if mnist.find_idx() is not None or mnist.cache_path().exists():
        return
    try:
        paths = [getattr(param, f) for f in ("net", "train_net") if param.has(f)] + list(param.test_net)
        nets = [load_net_param(resolve_path(p, base_dir, "net")) for p in paths]
        nets += [n for n in (param.net_param, param.train_net_param) if n.layer] + list(param.test_net_param)
        sources = {data.resolve_source(lp.data_param.source) for n in nets for lp in n.layer if lp.type == "Data"}
    except MinicaffeError:
        return  # the nets have an error: building them says which
    if any(s.startswith("mnist") for s in sources):
        log(f"Fetching MNIST: first use on this machine, into {mnist.cache_path().parent} (checked, converted once)")
        if progress is not None:
            progress.set_phase("fetching MNIST")
        mnist.fetch()


def test_cost_in_iterations(solver):
    """A guess of one full test's cost in training iterations, until a test has been timed: a
    forward pass is about half of a forward+backward+update, scaled by the batch sizes."""

    def batch(net):  # the first blob's first dimension: the batch of the data layer
        shape = next(iter(net.blobs.values())).shape if net.blobs else ()
        return shape[0] if shape else 1

    train_batch = max(batch(solver.net), 1)
    return sum(0.5 * n * batch(net) / train_batch for n, net in zip(solver.param.test_iter, solver.test_nets))


# -- the run ---------------------------------------------------------------------------------------
def blas_per_lane(workers, n_lanes):
    from ..parallel import blas

    return max(1, blas.cores() // (workers * n_lanes))


def choose_lanes(args, device, log):
    """Lanes (minicaffe/parallel/lanes.py) for this process: --lanes, else every core (shared
    among the worker threads); 1 on a GPU and on a distributed node (its launcher divides the
    cores).  BLAS then gets the cores left per lane, so threads never outnumber cores."""
    from ..parallel import blas, lanes

    if args.lanes is not None and args.lanes < 1:
        raise MinicaffeError(f"--lanes must be >= 1, got {args.lanes}")
    if args.lanes is not None:
        n, why = args.lanes, "--lanes"
    elif device != "cpu" or dist.is_node(args):
        n, why = 1, "GPU" if device != "cpu" else "distributed node"
    else:
        n, why = max(1, blas.cores() // max(1, args.workers)), f"{blas.cores()} cores / {args.workers} worker(s)"
    lanes.set_count(n)
    if device == "cpu" and not dist.is_node(args) and args.workers == 1:
        blas.set_threads(blas_per_lane(1, n))
    log(f"Lanes: {n} ({why}); BLAS threads {blas.get_threads()}")
    return n


def preload_key(param, base_dir, device, n_lanes, args):
    """What decides the kernels a run loads (minicaffe/memory/preload.py): the solver and the
    nets as their files give them, and the settings that pick a route (device, lanes, workers)."""
    from ..solvers.solver import resolve_path

    names = [getattr(param, f) for f in ("net", "train_net") if param.has(f)] + list(param.test_net)
    texts = []
    for name in names:
        try:
            with open(resolve_path(name, base_dir, "net"), "rb") as f:
                texts.append(f.read())
        except (OSError, MinicaffeError):
            texts.append(name)  # a file it cannot read: building the nets says so
    return preload.key(str(param), *texts, device, n_lanes, args.workers, args.staleness, dist.is_node(args))


def plan_arena(solver, args, device, log):
    """One process training on the CPU: place the training net, its test nets, the parameters,
    gradients and the solver's history in one arena (minicaffe.memory.plan_training; the test
    nets reuse the training net's activation and scratch bytes).  Planned without running the nets
    (the layers size their work buffers at reshape), so nothing unplanned is touched first.  The
    threaded and distributed runtimes and the GPU manage their own memory."""
    if device != "cpu" or args.workers > 1 or args.staleness > 0 or dist.is_node(args) or args.cuda_graph:
        return None
    from ..memory import plan_training

    plan = plan_training(solver, run_first=False)
    mib = 2.0**-20
    log(
        f"Memory: one arena of {plan.size * mib:.1f} MiB for the training net, {len(solver.test_nets)} test "
        f"net(s), parameters and solver history ({plan.naive * mib:.1f} MiB unshared)"
    )
    return plan


def run(args, argv=None):
    from ..solvers import get_solver, load_solver_param

    solver_path = resolve_solver(args.solver)
    name = os.path.basename(solver_path).replace("_solver.prototxt", "").replace(".prototxt", "")
    if args.weights and args.resume:
        raise MinicaffeError("give --weights (start from weights) or --resume (continue a run), not both")
    if args.workers < 1 or args.staleness < 0:
        raise MinicaffeError(f"--workers must be >= 1 and --staleness >= 0 (got {args.workers}, {args.staleness})")
    if args.worker_timeout is not None and not args.worker_timeout >= 0:
        raise MinicaffeError(
            f"--worker-timeout must be a number of seconds >= 0 (0 = no deadline), got {args.worker_timeout}"
        )
    if args.iters is not None and args.iters < 0:
        raise MinicaffeError(f"--iters must be >= 0, got {args.iters}")
    if args.force and not args.output:
        raise MinicaffeError("--force needs --output DIR: a run without --output gets a new directory of its own")
    if args.weights:
        check_weights_arg(args.weights)
    state_path = resolve_resume_arg(args.resume) if args.resume else None

    # where this run writes: decided now, created only once everything has loaded
    base = None
    if args.output:
        out_dir = args.output
        ours = run_files(out_dir)
        others = [f for f in os.listdir(out_dir) if f not in ours] if os.path.isdir(out_dir) else []
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise MinicaffeError(f"--output: {out_dir} is a file, not a directory")
        same = state_path is not None and _same_dir(os.path.dirname(os.path.abspath(state_path)), out_dir)
        if (ours or others) and not args.force and not same:
            what = f"{len(ours)} file(s) of an earlier run" if ours else f"{len(others)} other file(s)"
            raise MinicaffeError(
                f"--output: {out_dir} already holds {what} ({', '.join((ours or others)[:4])}"
                f"{', ...' if len(ours or others) > 4 else ''}); nothing there is overwritten unless you add --force "
                f"(which deletes the earlier run's snapshots, log and curves)"
            )
    elif state_path is not None:
        out_dir = os.path.dirname(os.path.abspath(state_path))  # a resumed run continues in its directory
        out_dir = os.path.relpath(out_dir) if not os.path.isabs(args.resume) else out_dir
    else:
        base = os.path.join("runs", name)
        out_dir = None  # runs/<name>/<stamp>, created below

    progress = Progress(0) if sys.stderr.isatty() else None
    log = Logger(progress=progress)
    log(f"minicaffe train: {solver_path}")
    log(banner())
    if args.data_dir:
        from ..data import set_data_dir

        set_data_dir(os.path.abspath(args.data_dir))

    param, base_dir = load_solver_param(solver_path)
    device = choose_device(args, param, solver_path, log)
    n_lanes = choose_lanes(args, device, log)
    kernels_key = preload_key(param, base_dir, device, n_lanes, args)
    if args.iters is not None:
        param.max_iter = args.iters
    if args.seed is not None:
        param.random_seed = args.seed
    if args.snapshot is not None:
        param.snapshot = args.snapshot
    if args.test_interval is not None:
        param.test_interval = args.test_interval
    prefix = os.path.basename(param.snapshot_prefix or name)
    pending_dir = out_dir or os.path.join(base, "<new>")
    param.snapshot_prefix = os.path.join(pending_dir, prefix)

    fetch_first(param, base_dir, progress, log)
    # numba's runtime and LLVM's JIT engine are built once per process, touching ~50 MiB of LLVM's
    # code: before the nets' arrays exist, and released again (minicaffe/memory/jitcode.py)
    jitcode.load_jit_runtime()
    # and the kernels the last run of these nets loaded, while the process is still small: their
    # loads run LLVM too, which on the first iteration would add to the run's peak (preload.py)
    fresh = device == "cpu" and preload.fresh()  # the process is this run: its kernels are the run's
    if fresh:
        n_loaded = preload.load(kernels_key)
        if n_loaded:
            log(f"Kernels: {n_loaded} loaded before the nets, as the last run of these nets used them")
    log("Setting up: building the nets and loading the data")
    if progress is not None:
        progress.set_phase("setting up: building the nets")
    solver = get_solver(param, base_dir=base_dir, log=log)
    plan_arena(solver, args, device, log)
    if args.weights:
        solver.net.copy_from(args.weights, log=log)  # logs ignored and missing layers, then a summary
        log(f"Initialized from {args.weights}")
    if state_path:
        solver.restore(state_path)
        state_dir = os.path.dirname(os.path.abspath(state_path))
        later = [p for it, p in snapshots(state_dir) if it > solver.iter]
        if later and not args.force and (not args.output or _same_dir(state_dir, args.output)):
            raise MinicaffeError(
                f"--resume: {os.path.dirname(state_path) or '.'} holds later snapshots of this run "
                f"({', '.join(os.path.basename(p) for p in later[:3])}) that continuing from iteration "
                f"{solver.iter} would overwrite; add --output NEWDIR to branch into a new directory"
            )
    start_iter = solver.iter

    # everything loaded: now the run directory exists
    if out_dir is None:
        out_dir = new_run_dir(base)
        link_latest(base, out_dir)
    else:
        same = state_path is not None and _same_dir(os.path.dirname(os.path.abspath(state_path)), out_dir)
        if args.force and not same:
            for f in run_files(out_dir):
                os.unlink(os.path.join(out_dir, f))
        os.makedirs(out_dir, exist_ok=True)
    clean_temporaries(out_dir, log)
    solver.param.snapshot_prefix = os.path.join(out_dir, prefix)
    log(f"Run directory: {out_dir}")
    history = os.path.join(os.path.dirname(os.path.abspath(state_path)), LOG_NAME) if state_path else None
    record = TrainLog(
        out_dir,
        {
            "solver": solver_path,
            "args": dict(vars(args)),
            "device": device,
            "versions": versions(),
            "resumed_at": start_iter if state_path else None,
            "resumed_from": state_path,
            "max_iter": solver.param.max_iter,
        },
        resume_iter=start_iter if state_path else None,
        history_from=history,
    )
    solver.on_iteration.append(record.on_iteration)
    solver.on_test.append(record.on_test)
    solver.on_snapshot.append(record.on_snapshot)

    p = solver.param
    eta = Eta(p.max_iter, start_iter, p.test_interval, test_cost_in_iterations(solver), bool(solver.test_nets))
    n_tests = len(solver.test_nets)
    tested_at = []

    def on_test_start(s, index):
        if index == 0:
            eta.test_begin()
        if progress is not None:
            progress.set_phase(f"testing net #{index} ({p.test_iter[index]} batches)")

    def on_test_end(s, index, result):
        if index == n_tests - 1:
            tested_at.append(s.iter)
            eta.test_end(s.iter)
            if progress is not None:
                progress.set_phase("training" if eta.seen else FIRST_ITERATION)
            left = eta.remaining()
            if left is not None and s.iter < p.max_iter:
                log(f"Progress: {s.iter}/{p.max_iter} iterations, ETA {fmt_seconds(left)}")

    def on_iteration(s, loss, lr):
        eta.iteration(s.iter)
        if progress is not None:
            if eta.seen == 1:
                progress.set_phase("training")
            progress.update(s.iter, f"loss {s.smoothed_loss:.4g}")

    solver.on_test_start.append(on_test_start)
    solver.on_test.append(on_test_end)
    solver.on_iteration.append(on_iteration)
    if progress is not None:
        progress.total, progress.done, progress.start_done, progress.eta = p.max_iter, start_iter, start_iter, eta
        progress.set_phase(FIRST_ITERATION)

    def on_signal(signum, frame):
        if solver.requested_stop:
            raise KeyboardInterrupt
        solver.requested_stop = True
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        log(f"{what}: stopping after this iteration and writing a snapshot (Ctrl-C again to abort)")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    start = time.perf_counter()
    status, message = "done", None
    eta.begin()
    # a diverging run is reported once, by the solver ("loss is nan at iteration N"), not by
    # numpy's overflow warnings on the way there
    numpy_errors = np.seterr(over="ignore", invalid="ignore", divide="ignore")
    try:
        if args.cuda_graph and (dist.is_node(args) or args.workers > 1 or args.staleness > 0):
            raise MinicaffeError(
                "--cuda-graph captures one process's training step; it does not combine with --workers, "
                "--staleness or a distributed run"
            )
        if dist.is_node(args):  # node 0 of a distributed run (minicaffe/dist/launch.py)
            record.write(dist.train(solver, args, log, out_dir), flush=True)
        elif args.workers > 1 or args.staleness > 0:
            from ..parallel import train_with_workers

            timeout = {} if args.worker_timeout is None else {"worker_timeout": args.worker_timeout or None}
            trainer = train_with_workers(
                solver,
                args.workers,
                staleness=args.staleness,
                blas_threads=blas_per_lane(args.workers, n_lanes),
                **timeout,
            )
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
            if args.cuda_graph:
                solver.enable_graph("graph")  # a SolverError saying why where it cannot
            solver.solve()
        if solver.test_nets and p.test_interval and not solver.requested_stop and tested_at[-1:] != [solver.iter]:
            # Caffe tests after the last iteration when it falls on a test interval; a run cut
            # short by --iters ends between intervals, and its result should still be measured
            log(f"Final test at iteration {solver.iter} (the run ended between test intervals)")
            solver.test_all()
    except MinicaffeError as exc:  # a diverging loss, a data file gone bad mid-run, ...
        status, message = "error", str(exc)
        if progress is not None:
            progress.close()
        record.flush()
        kept = last_snapshot(out_dir)
        log(f"ERROR: {exc}")
        log(f"The last good snapshot is kept: {kept}" if kept else "No snapshot had been written yet.")
        finish(record, out_dir, args, status, solver.iter, message, log)
        return 1
    except BaseException as exc:  # a second Ctrl-C, or a bug: the log keeps what happened
        why = "a second Ctrl-C" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        record.close("aborted", solver.iter, why)
        raise
    finally:
        np.seterr(**numpy_errors)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if progress is not None:
            progress.close()
    elapsed = time.perf_counter() - start
    iteration, stopped = solver.iter, solver.requested_stop
    if fresh:
        preload.save(kernels_key)  # the kernels this run loaded, for the next one
    # the nets, their arena and the data readers are not needed for the log and the plot: give
    # their memory back first, so that drawing the curves (matplotlib) does not add to it; the C
    # heap's freed pages too (the blobs' shapes, the layers' small arrays)
    solver = None
    trim_heap()  # collects the nets' reference cycles first
    done = iteration - start_iter
    if stopped:
        status = "stopped"
    log(
        f"Trained {done} iterations in {elapsed:.1f} s ({fmt_seconds(elapsed)}, "
        f"{1000 * elapsed / max(done, 1):.2f} ms/iter including tests)"
    )
    data = finish(record, out_dir, args, status, iteration, message, log)
    tests = [t for t in data["test"] if t["net"] == 0]
    if tests:
        final = ", ".join(f"{k} = {v:.4f}" for k, v in tests[-1]["outputs"].items() if isinstance(v, float))
        kind = "Last test" if stopped else "Final test"
        log(f"{kind} (iteration {tests[-1]['iter']}): {final}")
    if stopped:
        state = last_snapshot(out_dir)
        if state:
            log(f"Stopped at iteration {iteration}. To continue this run:")
            log(f"    {resume_command(sys.argv[1:] if argv is None else argv, state)}")
        return 130
    return 0


def finish(record, out_dir, args, status, iteration, message, log):
    record.close(status, iteration, message)
    data = read_log(out_dir)
    png = None
    if not args.no_plot:
        png = os.path.join(out_dir, PLOT_NAME)
        plot_curves(data, png)
        trim_heap()  # the figure's memory, before the process ends (see run's end)
    log(f"Log: {record.path}" + (f"  Curves: {png}" if png else ""))
    return data


# the flags of a distributed run that one process has no use for (minicaffe/dist/launch.py)
DIST_ONLY = ("comm", "wfbp", "bucket_kb", "link")


def ignored_dist_flags(args, argv):
    """The distributed-only flags given to a run of one process (no --nodes > 1, not a node): the
    command line parsed once more with those flags' defaults set to None shows which were given."""
    if dist.is_launcher(args) or dist.is_node(args):
        return []
    given = build_parser()
    given.set_defaults(**dict.fromkeys(DIST_ONLY))
    again = given.parse_args(argv)
    return ["--" + name.replace("_", "-") for name in DIST_ONLY if getattr(again, name) is not None]


def main(argv=None):
    from ..parallel import blas, lanes

    parser = build_parser()
    args = parser.parse_args(argv)
    ignored = ignored_dist_flags(args, argv)
    if ignored:  # a sweep over --nodes 1 2 4 passes them to the one-process baseline too: a note, not an error
        print(
            f"note: {', '.join(ignored)} apply only to a distributed run (--nodes > 1); this one-process run "
            "ignores them",
            file=sys.stderr,
        )
    saved = lanes.count(), blas.get_threads()  # run() sets both for its run; a caller's are restored
    try:
        if dist.is_launcher(args):  # --nodes N: N node processes on this machine
            return dist.launch_local(sys.argv[1:] if argv is None else list(argv), args)
        # LLVM's code pages leave the process after every compile and cache load: a training step
        # never runs LLVM, and its ~70 MiB would otherwise stay resident (minicaffe/memory/jitcode.py)
        with jitcode.keep_llvm_code_out():
            if dist.is_node(args) and dist.rank_of(args) != 0:  # node 0 runs the code below, the others:
                return dist.run_secondary(args)
            return run(args, argv)
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    finally:
        lanes.set_count(saved[0])
        if saved[1]:
            blas.set_threads(saved[1])
