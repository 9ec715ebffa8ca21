"""What the command-line tools share: finding nets by short name, the version banner, logging."""

import functools
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


class Eta:
    """The remaining time of a run: the training iterations left at their measured pace, plus the
    tests still to come at their measured cost.

    What makes a naive ``elapsed / done * left`` wrong, and what this does instead:

    - numba compiles every kernel on its first call (a first run only; later runs load the
      compiled code from numba's cache), so the first iteration and the first test of a process
      can take seconds: the first ``warmup`` iterations and the first test are left out of the
      pace;
    - the pace is measured over the recent half of the iterations, so it follows a machine whose
      load changes (a steady machine is where the estimate is right; nothing predicts new load);
    - the time spent testing is not training time: tests are timed apart, and each remaining
      test (every ``test_interval`` iterations, and the final one) is added at its own cost.
      Until a test without compilation has been timed, a test is guessed to cost ``test_cost``
      training iterations (the tool computes it from the test batches), capped by the first
      test's time.

    ``clock`` is any function returning seconds (tests drive it with a synthetic clock).
    """

    def __init__(self, total, start=0, test_interval=0, test_cost=0.0, final_test=True, warmup=1, clock=None):
        self.total, self.start = total, start
        self.test_interval, self.test_cost, self.final_test = test_interval, test_cost, final_test
        self.clock = clock or time.perf_counter
        self.warmup = warmup
        self.iter = start
        self.train_seconds, self.train_iters = 0.0, 0  # after warm-up
        self.cumulative = [0.0]  # training seconds after each post-warm-up iteration
        self.seen = 0  # iterations completed in this process
        self.first_test = None  # seconds of the first test of this process (compilation included)
        self.test_seconds = []  # the later tests
        self.last_test_iter = None
        self._mark = None  # clock at the end of the previous iteration (or test)
        self.t_begin = None
        self._test_t0 = None

    def begin(self):
        """Training (or its first test) starts now."""
        self._mark = self.t_begin = self.clock()

    def whole_run(self):
        """Seconds the whole run (this process's part) should take: elapsed + remaining."""
        left = self.remaining()
        return None if left is None or self.t_begin is None else self.clock() - self.t_begin + left

    def iteration(self, it):
        """Iteration ``it - 1`` has finished (``it`` = the solver's iteration count now)."""
        now = self.clock()
        if self._mark is not None:
            self.seen += 1
            if self.seen > self.warmup:
                self.train_seconds += now - self._mark
                self.train_iters += 1
                self.cumulative.append(self.train_seconds)
        self._mark = now
        self.iter = it

    def test_begin(self):
        self._test_t0 = self.clock()

    def test_end(self, it):
        now = self.clock()
        if self._test_t0 is not None:
            spent = now - self._test_t0
            if self.first_test is None:
                self.first_test = spent
            else:
                self.test_seconds.append(spent)
        self.last_test_iter = it
        self._test_t0 = None
        if self._mark is not None:
            self._mark = now  # the test is not part of the next iteration's time

    def seconds_per_iteration(self):
        """The pace of the recent half of the iterations (at least 20): it follows a machine whose
        load changes, and averages over enough iterations to be steady."""
        n = self.train_iters
        if not n:
            return None
        window = min(n, max(20, n // 2))
        return (self.cumulative[n] - self.cumulative[n - window]) / window

    def seconds_per_test(self):
        per_iter = self.seconds_per_iteration()
        if self.test_seconds:
            return sum(self.test_seconds) / len(self.test_seconds)
        guess = self.test_cost * per_iter if per_iter is not None else None
        if self.first_test is not None:
            return self.first_test if guess is None else min(self.first_test, guess)
        return guess

    def tests_left(self):
        if not self.test_interval:
            return 0
        k = self.test_interval
        first = -(-self.iter // k) * k  # the first multiple of k at or after iter
        n = len(range(first, self.total, k))
        if self.last_test_iter == first and first < self.total:
            n -= 1  # the test at this iteration has run already
        if self.final_test and self.last_test_iter != self.total:
            n += 1
        return n

    def remaining(self):
        """Seconds left, or None while there is nothing to measure the pace by."""
        per_iter = self.seconds_per_iteration()
        if per_iter is None:
            return None
        left = max(self.total - self.iter, 0) * per_iter
        tests = self.tests_left()
        if tests:
            left += tests * (self.seconds_per_test() or 0.0)
        return left


class Progress:
    """A one-line progress bar redrawn in place on a terminal (stderr): the phase the run is in
    (setting up, testing, training), iterations, pace and the time left (see :class:`Eta`)."""

    def __init__(self, total, start=0, stream=None, width=28, eta=None):
        self.stream = stream or sys.stderr
        self.total, self.done, self.start_done = total, start, start
        self.width = width
        self.eta = eta
        self.phase = "setting up"
        self.extra = ""
        self.enabled = self.stream.isatty()
        self._last = 0.0

    def set_phase(self, phase):
        self.phase = phase
        self.redraw()

    def update(self, done, extra=""):
        self.done, self.extra = done, extra
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or done >= self.total):
            self._last = now
            self.redraw()

    def line(self):
        if not self.total:
            return f"{self.phase} ..."
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.width)
        per = self.eta.seconds_per_iteration() if self.eta else None
        left = self.eta.remaining() if self.eta else None
        pace = f"{1000 * per:.1f} ms/it" if per is not None else "-- ms/it"
        eta = f"ETA {fmt_seconds(left)}" if left is not None else "ETA --"
        whole = self.eta.whole_run() if self.eta else None
        if whole is not None:
            eta += f" (run {fmt_seconds(whole)})"
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {self.phase}, "
            f"{pace}, {eta} {self.extra}"
        ).rstrip()

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


def one_line_errors(main):
    """A tool's ``main(argv)``: minicaffe's errors become one ``error:`` line on stderr and exit
    status 1 (never a traceback); otherwise the status ``main`` returns (None: 0)."""

    @functools.wraps(main)
    def wrapped(argv=None):
        try:
            status = main(argv)
        except MinicaffeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0 if status is None else status

    return wrapped


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
