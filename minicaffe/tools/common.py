"""What the command-line tools share: finding nets by short name, the version banner, logging."""

import os
import platform
import sys
import time

from ..errors import MinicaffeError

NETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "nets")


def known_nets():
    if not os.path.isdir(NETS_DIR):
        return []
    return sorted(f[: -len("_solver.prototxt")] for f in os.listdir(NETS_DIR) if f.endswith("_solver.prototxt"))


def resolve_solver(name):
    """A solver prototxt path from a path or a short name ('lenet' -> nets/lenet_solver.prototxt)."""
    if os.path.exists(name):
        return name
    for candidate in (os.path.join(NETS_DIR, f"{name}_solver.prototxt"), os.path.join(NETS_DIR, name)):
        if os.path.exists(candidate):
            return candidate
    from ..errors import did_you_mean

    raise MinicaffeError(
        f"no solver '{name}': not a file, and not a short name of nets/."
        + did_you_mean(name, known_nets(), "short names")
    )


def resolve_net(name, kind=""):
    """A net prototxt from a path or a short name ('lenet' -> nets/lenet.prototxt or its train_test)."""
    if os.path.exists(name):
        return name
    for suffix in ((f"_{kind}",) if kind else ()) + ("", "_deploy", "_train_test"):
        candidate = os.path.join(NETS_DIR, f"{name}{suffix}.prototxt")
        if os.path.exists(candidate):
            return candidate
    raise MinicaffeError(
        f"no net '{name}': not a file, and not a short name of nets/ "
        f"({', '.join(sorted(f[:-9] for f in os.listdir(NETS_DIR) if f.endswith('.prototxt')))})"
    )


def versions():
    import numba
    import numpy

    from .. import __version__

    return {
        "minicaffe": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def banner():
    v = versions()
    return " ".join(f"{k} {val}" for k, val in v.items())


class Logger:
    """Caffe-like log lines with a timestamp; coexists with a progress line on a terminal."""

    def __init__(self, stream=None, progress=None):
        self.stream = stream or sys.stdout
        self.progress = progress
        self.start = time.time()

    def __call__(self, message):
        if self.progress is not None:
            self.progress.clear()
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(f"I{stamp} {message}\n")
        self.stream.flush()
        if self.progress is not None:
            self.progress.redraw()


def fmt_seconds(s):
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """A one-line progress bar with ETA, redrawn in place on a terminal (stderr)."""

    def __init__(self, total, start=0, stream=None, width=28):
        self.stream = stream or sys.stderr
        self.total, self.done, self.start_done = total, start, start
        self.width = width
        self.t0 = time.perf_counter()
        self.extra = ""
        self.enabled = self.stream.isatty()
        self._last = 0.0

    def update(self, done, extra=""):
        self.done, self.extra = done, extra
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or done >= self.total):
            self._last = now
            self.redraw()

    def line(self):
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.width)
        elapsed = time.perf_counter() - self.t0
        n = self.done - self.start_done
        eta = elapsed / n * (self.total - self.done) if n > 0 else 0.0
        per = f"{1000 * elapsed / n:.1f} ms/it" if n > 0 else "-- ms/it"
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{per} ETA {fmt_seconds(eta)} {self.extra}"
        )

    def redraw(self):
        if self.enabled:
            self.stream.write("\r\x1b[K" + self.line())
            self.stream.flush()

    def clear(self):
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def close(self):
        if self.enabled:
            self.clear()


def run_net_tool(args, body):
    """The frame of ``test`` and ``time``: settings from the common flags, the net, one-line errors.

    ``body(net, path, log)`` does the tool's work on the net built from ``args.model``.
    """
    from .. import backend as _backend
    from ..net import Net

    log = Logger()
    try:
        if args.iterations < 1:
            raise MinicaffeError(f"--iterations must be >= 1, got {args.iterations}")
        if args.data_dir:
            from ..data import set_data_dir

            set_data_dir(args.data_dir)
        _backend.set_mode("gpu" if args.device == "gpu" else "cpu")
        path = resolve_net(args.model, "train_test")
        log(banner())
        net = Net(path, args.phase, weights=getattr(args, "weights", None))
        body(net, path, log)
        return 0
    except MinicaffeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
