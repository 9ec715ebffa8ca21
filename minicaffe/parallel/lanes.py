"""Lanes: one layer's work split across the cores of one process (intra-op parallelism).

SingleCaffe's workers (runtime.py) split a *batch* across threads, each running the whole net
on its shard.  Lanes split *one layer call*: a Convolution gives each lane a slice of the
batch's images (its own im2col, GEMMs and layout change, on its own column buffer), an
InnerProduct gives each lane a block of the output's rows; the calling thread runs lane 0 and
waits for the others.  numba's kernels (``nogil``) and numpy's BLAS calls release the GIL, so the
lanes run on different cores at once; the only serial parts are the Python lines that start and
join them (a handoff measured at 20-60 us) and the layers that do not split (pooling, ReLU,
the loss: a few per cent of a LeNet step).

    from minicaffe.parallel import lanes
    lanes.set_count(2)            # what `python -m minicaffe.train` does on a 2-core machine
    lanes.run([task0, task1])     # task0 here, task1 on a helper thread; both done on return

With lanes, each lane's GEMMs call BLAS with one thread (the train tool sets OpenBLAS to
cores // (workers x lanes) threads), so the cores are not oversubscribed.  Results differ from
one lane's only in the order of floating-point sums: a weight gradient is summed per lane, then
the partial sums are added in lane order (deterministic for a given lane count).  The count is
process-wide and 1 unless set; every thread that calls ``run`` gets helper threads of its own,
so SingleCaffe's worker threads may each use lanes too.  A thread's helpers end when it does.
"""

import threading
import weakref

_state = {"count": 1}
_local = threading.local()


def count():
    """How many lanes a layer call may use (1: everything runs on the calling thread)."""
    return _state["count"]


def set_count(n):
    """Let layer calls use ``n`` lanes (>= 1); returns the previous count."""
    n = int(n)
    if n < 1:
        raise ValueError(f"lanes must be >= 1, got {n}")
    old, _state["count"] = _state["count"], n
    return old


class _Helper:
    """A daemon thread that runs one task at a time when the calling thread hands it one."""

    def __init__(self):
        self.task = None
        self.error = None
        self.stop = False  # set when the thread that owns this helper has ended (_dismiss)
        self.ready = threading.Event()  # set by the caller: a task is waiting
        self.done = threading.Event()  # set by the helper: the task has finished
        self.thread = threading.Thread(target=self._loop, name="minicaffe-lane", daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            self.ready.wait()
            self.ready.clear()
            if self.stop:
                return
            try:
                self.task()
            except BaseException as e:  # handed back to the caller, which re-raises it
                self.error = e
            self.task = None
            self.done.set()

    def start(self, task):
        while self.task is not None:  # still running a task of a run interrupted by Ctrl-C
            self.done.wait(0.01)
        self.error = None
        self.done.clear()
        self.task = task
        self.ready.set()

    def join(self):
        self.done.wait()
        err, self.error = self.error, None
        return err


class _Crew:
    """The helpers of one calling thread, kept in its thread-local storage.  When that thread
    ends, Python frees its thread-locals, the crew with them, and ``_dismiss`` ends the helpers
    (a SingleCaffe worker's lanes end with the worker)."""

    __slots__ = ("members", "__weakref__")

    def __init__(self):
        self.members = []
        weakref.finalize(self, _dismiss, self.members)


def _dismiss(members):
    for h in members:
        h.stop = True
        h.ready.set()


def _helpers(k):
    crew = getattr(_local, "crew", None)
    if crew is None:
        crew = _local.crew = _Crew()
    hs = crew.members
    while len(hs) < k:
        hs.append(_Helper())
    return hs


def run(tasks):
    """Run the callables ``tasks`` at once (the first on this thread) and return when all have
    finished; an exception in any is raised here (the first lane's first) after all are done."""
    if len(tasks) == 1:
        tasks[0]()
        return
    hs = _helpers(len(tasks) - 1)
    for h, t in zip(hs, tasks[1:]):
        h.start(t)
    first = None
    try:
        tasks[0]()
    except BaseException as e:
        first = e
    errors = [h.join() for h in hs[: len(tasks) - 1]]
    for e in [first, *errors]:
        if e is not None:
            raise e


def split(n, parts):
    """``parts`` near-equal (start, stop) ranges covering range(n), none empty."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    out, s = [], 0
    for k in range(parts):
        e = s + q + (1 if k < r else 0)
        out.append((s, e))
        s = e
    return out


def batch(n, fn, size):
    """``fn(a, b)`` for near-equal slices [a, b) of a batch of ``n`` images, one per lane, at
    once; one call ``fn(0, n)`` with one lane or when the call touches fewer than MIN_ELEMENTS
    values (``size``): below that the handoff costs more than it saves."""
    parts = split(n, count()) if size >= MIN_ELEMENTS else [(0, n)]
    run([(lambda a=a, b=b: fn(a, b)) for a, b in parts])


def gemm(backend, trans_a, trans_b, alpha, a, b, beta, c):
    """``backend.gemm`` with the rows of c split across the lanes (each lane: c[r0:r1] =
    alpha op(a)[r0:r1] op(b) + beta c[r0:r1]); one lane, or a c of few rows: one call."""
    rows = c.shape[0]
    k = a.shape[0] if trans_a else a.shape[-1]
    big = rows >= 2 * MIN_ROWS and 2.0 * c.size * k >= MIN_FLOPS
    parts = split(rows, count()) if big else [(0, rows)]
    if len(parts) == 1:
        backend.gemm(trans_a, trans_b, alpha, a, b, beta, c)
        return

    def task(r0, r1):
        ak = a[:, r0:r1] if trans_a else a[r0:r1]
        return lambda: backend.gemm(trans_a, trans_b, alpha, ak, b, beta, c[r0:r1])

    run([task(r0, r1) for r0, r1 in parts])


#: fewest rows of c per lane, and fewest FLOPs in all, worth a handoff in ``gemm`` (LeNet's
#: ip2, 0.6 MFLOP, ran 3x slower split in two: the handoff costs more than the GEMM)
MIN_ROWS = 16
MIN_FLOPS = 4e6
#: fewest values a batch-split call (``batch``: pooling) must touch to be split
MIN_ELEMENTS = 1 << 17
