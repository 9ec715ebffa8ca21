"""How a GPU kernel is launched: the ONLY place where a real GPU and numba's simulator differ.

Every kernel in ``kernels/cuda`` is one ``@cuda.jit`` function, and the same function runs on
both targets; what differs is

* the arrays: CuPy device arrays on a GPU; in the simulator ``SimArray`` (``simarray.py``):
  numpy storage that refuses implicit conversion to numpy and mixing with numpy, as CuPy does;
* how an array is handed to a kernel: a CuPy array goes in through ``__cuda_array_interface__``
  (``cuda.as_cuda_array(a, sync=False)``: zero-copy, and no host-blocking sync on CuPy's stream,
  which is the stream we launch on anyway); a ``SimArray``'s storage is wrapped as the
  simulator's own device array (``FakeCUDAArray``: zero-copy too).  A host numpy array is
  refused on both targets: numba would copy it in and back out around the launch, a hidden
  round trip on a GPU;
* the stream: on a GPU, CuPy's current stream (so our kernels are ordered with CuPy's own
  element-wise operations without any synchronization); the simulator runs everything at once;
* the launch sizes (``Config``): the simulator runs every CUDA thread as a Python thread (about a
  millisecond each), so it launches a handful; a GPU launches tens of thousands.  Kernels use
  grid-stride loops, so their result does not depend on the grid size: a small grid in the
  simulator tests the same code (and the same indexing) that a full grid runs on the GPU.

Which target numba gives is decided once per process, when ``numba.cuda`` is first imported
(``NUMBA_ENABLE_CUDASIM=1`` selects the simulator): a process has one or the other, never both.

The launcher also keeps what launch overhead is made of, inspectable (``docs/GPU.md``):

* **launch configurations, once per shape**: ``launch1d(kernel, n, ...)`` looks the grid and
  block for ``n`` work items up in ``configs`` (keyed by kernel and size); only a new shape computes
  one (``config_misses``);
* **eager compilation**: ``precompile(kernel, argtypes)`` compiles a kernel for an explicit
  signature before the first step (the GPU backends do it for every default kernel and the net's
  dtype when a net is built), so no launch inside a step compiles -- a compilation in the middle of
  a step is a pause of a second, and a CUDA-graph capture cannot contain one.  Every launch's
  argument types are checked against what was compiled: ``lazy_compiles`` counts the launches
  that would have compiled (on a GPU, numba compiles them then; in the simulator, which compiles
  nothing, the count is the proof that the signatures are complete);
* **a launch counter** (``launches``): numba kernels by name, plus, in the simulator, every
  array-module operation that is a kernel on a GPU (``simarray.OPS``: CuPy launches one kernel per
  element-wise operation, reduction or copy) and every scalar read that synchronizes the host;
* **capture mode** (``capturing()``): inside it, any host<->device copy, synchronization or scalar
  read raises ``CaptureViolation`` -- what a CUDA-graph capture of a stream cannot contain.  In
  the simulator this proves a training step capturable; on a GPU ``capture()`` records the
  launches of a stream into a CuPy graph to replay.

The launcher also counts host<->device copies (``Transfers``): ``to_host``/``from_host`` and the
blobs' lazy syncs (``copy_to_host``/``copy_from_host``) are the engine's only sanctioned ways
across the bus, and the tests read the counter to prove that a training step makes no hidden
round trips.
"""

import contextlib
import math
import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from . import simarray as _simarray
from .simarray import CaptureViolation, SimArray

__all__ = ["Launcher", "launcher", "Config", "Transfers", "CaptureViolation", "arg_types", "kernel_name"]


def is_simulator():
    """True when this process's numba.cuda is the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


@dataclass(frozen=True)
class Config:
    """Launch sizes.  ``threads``: threads per block of the 1-d grid-stride kernels;
    ``max_blocks``: cap on the grid (more blocks than that just loop); ``gemm_tile``: the tiled
    GEMM's square tile (= block edge); ``regblock``: (BM, BN, BK, TM, TN) of the register-blocked
    GEMM; ``row_threads``: block size of the one-block-per-row reductions (softmax);
    ``gemm_grid``: cap on each grid axis of the 2-d GEMM grids; ``loss_one_block``: up to this
    many positions the fused loss forward runs as one block (one launch, no atomics)."""

    threads: int = 256
    max_blocks: int = 8192
    gemm_tile: int = 16
    regblock: tuple = (128, 128, 8, 8, 8)
    row_threads: int = 128
    gemm_grid: int = 65535
    loss_one_block: int = 16384


#: the configuration a GPU uses
GPU_CONFIG = Config()
#: the simulator's, for the engine (the layer and net tests): as few threads per launch as keep
#: the same code paths -- two blocks of two threads, tiles smaller than the matrices -- because
#: each simulated thread is a Python thread, and starting one costs about a millisecond
SIM_CONFIG = Config(threads=2, max_blocks=2, gemm_tile=4, regblock=(16, 16, 4, 4, 4), row_threads=2, gemm_grid=2)
#: a wider simulator configuration for the kernel tests (tests/test_cuda_kernels.py): more
#: threads per block and a grid that does not divide the work evenly
SIM_WIDE_CONFIG = Config(threads=8, max_blocks=3, gemm_tile=4, regblock=(16, 16, 4, 4, 4), row_threads=8, gemm_grid=3)


@dataclass
class Transfers:
    """Host<->device copies made through ``to_host`` / ``from_host``: counts and bytes."""

    d2h: int = 0
    h2d: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reset(self):
        with self._lock:
            self.d2h = self.h2d = self.d2h_bytes = self.h2d_bytes = 0

    def snapshot(self):
        return {"d2h": self.d2h, "h2d": self.h2d, "d2h_bytes": self.d2h_bytes, "h2d_bytes": self.h2d_bytes}

    def _count(self, kind, nbytes):
        with self._lock:
            if kind == "d2h":
                self.d2h += 1
                self.d2h_bytes += int(nbytes)
            else:
                self.h2d += 1
                self.h2d_bytes += int(nbytes)


def kernel_name(kernel):
    """The Python name of a ``@cuda.jit`` kernel (a dispatcher, or the simulator's kernel)."""
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel
    return getattr(fn, "__name__", repr(kernel))


def _numba_type(a):
    """numba's type of one kernel argument, as numba's dispatcher computes it on a GPU: an array
    is Array(dtype, ndim, layout) (layout 'C', 'F' or 'A' from its flags); a numpy scalar its
    dtype; a Python int int64, float float64, bool boolean."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    if isinstance(a, (bool, np.bool_)):
        return types.boolean
    if isinstance(a, int):
        return types.int64
    if isinstance(a, float):
        return types.float64
    if isinstance(a, np.generic):
        return from_dtype(a.dtype)
    flags = a.flags
    layout = "C" if flags.c_contiguous else ("F" if flags.f_contiguous else "A")
    return types.Array(from_dtype(a.dtype), a.ndim, layout)


def arg_types(args):
    """The signature (a tuple of numba types) a launch with ``args`` dispatches on."""
    return tuple(_numba_type(a) for a in args)


class Launches:
    """What the launcher launched: ``kernels`` (numba kernel name -> launches), and from the
    simulator's arrays ``xp_ops`` (array-module operations that are kernels on a GPU) and
    ``host_syncs`` (scalar reads that wait for the device); ``reset()``, ``total()``."""

    def __init__(self):
        self.kernels = Counter()

    def reset(self):
        self.kernels.clear()
        _simarray.OPS.clear()
        _simarray.SYNCS.clear()

    @property
    def xp_ops(self):
        return _simarray.OPS

    @property
    def host_syncs(self):
        return _simarray.SYNCS

    def total(self):
        """Kernel launches: numba's plus the array module's (the latter counted in the simulator)."""
        return sum(self.kernels.values()) + sum(_simarray.OPS.values())

    def snapshot(self):
        return {
            "kernels": sum(self.kernels.values()),
            "xp_ops": sum(_simarray.OPS.values()),
            "total": self.total(),
            "host_syncs": sum(_simarray.SYNCS.values()),
        }


class Launcher:
    """Launches kernels on one target.  ``xp`` is the array module (cupy, or the simulator's
    ``simcupy``)."""

    def __init__(self, simulator, config=None):
        self.simulator = bool(simulator)
        if self.simulator != is_simulator():
            want = "simulator" if self.simulator else "real CUDA target"
            have = "simulator" if is_simulator() else "real CUDA target"
            raise RuntimeError(
                f"a {want} launcher was asked for, but this process's numba.cuda is the "
                f"{have} (NUMBA_ENABLE_CUDASIM decides it once per process, at the first "
                f"import of numba.cuda)"
            )
        self.config = config or (SIM_CONFIG if simulator else GPU_CONFIG)
        self.transfers = Transfers()
        self.launches = Launches()
        #: (kernel name, work items, items per block, block) -> (grid, block): launch1d's cache
        self.configs = {}
        self.config_misses = 0
        #: kernel name -> the signatures compiled ahead of time (precompile)
        self.compiled = {}
        #: kernel name -> signatures launched that were not compiled ahead (each a compilation)
        self.lazy = {}
        self.lazy_compiles = 0
        #: check each launch's signature against the compiled ones: always in the simulator (its
        #: proof); on a GPU only when asked (typing every argument costs microseconds a launch,
        #: and numba's own dispatcher compiles what is missing anyway: kernel.overloads shows it)
        self.check_signatures = self.simulator
        self._names = {}
        self._capture = threading.local()
        if self.simulator:
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            from .simarray import simcupy

            self.xp = simcupy
            self._fake = FakeCUDAArray
            # numba's simulator runs one kernel at a time per process ("concurrent simulated
            # kernel not supported"); a GPU runs launches from several host threads (the threaded
            # runtime's workers) in stream order, so the simulator's launches are serialized here
            self._sim_lock = threading.Lock()
        else:
            import cupy

            self.xp = cupy
            self._streams = {}

    # -- sizes ---------------------------------------------------------------------------------
    def blocks(self, n, threads=None):
        """Blocks for n work items at ``threads`` per block, capped (grid-stride loops do the rest)."""
        t = threads or self.config.threads
        return max(1, min(math.ceil(n / t), self.config.max_blocks))

    def grid2d(self, rows, cols, by, bx):
        """A 2-d grid (x over columns, y over rows) of (by, bx)-thread blocks, each axis capped."""
        g = self.config.gemm_grid
        return (max(1, min(math.ceil(cols / bx), g)), max(1, min(math.ceil(rows / by), g)))

    def launch1d(self, kernel, n, *args, per_block=None, block=None):
        """Launch ``kernel`` over ``n`` work items on a 1-d grid (grid-stride kernels): ``block``
        threads a block (default ``config.threads``), a block per ``per_block`` items (default:
        per thread).  The grid for a (kernel, n) is computed once and kept in ``configs``."""
        key = (kernel, n, per_block, block)
        cfg = self.configs.get(key)
        if cfg is None:
            b = block or self.config.threads
            cfg = self.configs[key] = (self.blocks(n, per_block or b), b)
            self.config_misses += 1
        self.launch(kernel, cfg[0], cfg[1], *args)

    def config_table(self):
        """The cached launch configurations, readable: {(kernel name, n): (grid, block)}."""
        return {(kernel_name(k), n): cfg for (k, n, _, _), cfg in self.configs.items()}

    # -- compilation ahead of the step -------------------------------------------------------------
    def _name(self, kernel):
        name = self._names.get(kernel)
        if name is None:
            name = self._names[kernel] = kernel_name(kernel)
        return name

    def precompile(self, kernel, argtypes):
        """Compile ``kernel`` for the signature ``argtypes`` (a tuple of numba types) now, not at
        its first launch.  On a GPU numba compiles it; the simulator compiles nothing and
        records the signature, against which every launch is then checked."""
        argtypes = tuple(argtypes)
        done = self.compiled.setdefault(self._name(kernel), set())
        if argtypes in done:
            return False
        if not self.simulator:
            kernel.compile(argtypes)
        done.add(argtypes)
        return True

    def _check_compiled(self, kernel, args):
        name = self._name(kernel)
        sig = arg_types(args)
        if sig not in self.compiled.get(name, ()):
            seen = self.lazy.setdefault(name, set())
            if sig not in seen:
                seen.add(sig)
                self.lazy_compiles += 1
                if not self.simulator:
                    self.compiled.setdefault(name, set()).add(sig)  # numba compiles it now, once

    # -- launching -----------------------------------------------------------------------------
    def _arg(self, a):
        if isinstance(a, np.ndarray):
            # numba would copy a host array in and back out around the launch: a hidden round
            # trip on a GPU (and in-place results lost in the simulator).  Kernels take device
            # arrays only, on both targets.
            raise TypeError(
                f"a kernel was handed a host numpy array of shape {a.shape}: kernels take device "
                f"arrays (backend.from_host copies one to the device)"
            )
        if self.simulator:
            return self._fake(a._a) if type(a) is SimArray else a
        if hasattr(a, "__cuda_array_interface__"):
            return cuda.as_cuda_array(a, sync=False)
        return a

    def stream(self):
        """numba's handle on CuPy's current stream (GPU); the simulator's dummy stream."""
        if self.simulator:
            return 0
        import cupy

        ptr = cupy.cuda.get_current_stream().ptr
        s = self._streams.get(ptr)
        if s is None:
            s = self._streams[ptr] = cuda.default_stream() if ptr == 0 else cuda.external_stream(ptr)
        return s

    def launch(self, kernel, grid, block, *args):
        self.launches.kernels[self._name(kernel)] += 1
        if self.check_signatures:
            self._check_compiled(kernel, args)
        if self.simulator:
            with self._sim_lock:
                kernel[grid, block, 0](*[self._arg(a) for a in args])
            return
        kernel[grid, block, self.stream()](*[self._arg(a) for a in args])

    # -- capture mode ------------------------------------------------------------------------------
    def in_capture(self):
        return getattr(self._capture, "what", None)

    def _refuse_in_capture(self, action):
        what = self.in_capture()
        if what is not None:
            raise CaptureViolation(
                f"{action} inside {what}: a CUDA-graph capture records device work only; a host<->device "
                f"copy or a wait for the device cannot be part of it (move it before or after the step)"
            )

    @contextlib.contextmanager
    def capturing(self, what="a captured step"):
        """Capture mode on this thread: any copy across the bus, synchronization or scalar read
        inside raises CaptureViolation.  On a GPU, ``capture()`` (which enters it) records a graph;
        alone, it checks the contract on either target (the simulator's proof)."""
        if self.in_capture() is not None:
            raise CaptureViolation(f"capture mode entered twice ({self.in_capture()})")
        self._capture.what = what
        token = _simarray.enter_capture(what)
        try:
            yield self
        finally:
            _simarray.leave_capture(token)
            self._capture.what = None

    @contextlib.contextmanager
    def capture(self, what="a captured step"):
        """Record the device work launched inside on a new stream as a CUDA graph (a real GPU
        only): ``with L.capture() as g: step()``, then ``g.graph.launch()`` replays it.  The
        kernels must have been compiled and the arrays allocated before (a warm-up step)."""
        if self.simulator:
            raise CaptureViolation(
                "CUDA-graph capture needs a real GPU: numba's simulator records no graph (its capture "
                "mode, capturing(), checks a step's contract instead)"
            )
        import cupy

        holder = _Captured()
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                with self.capturing(what):
                    yield holder
            finally:
                holder.graph = stream.end_capture()
        holder.stream = stream

    def synchronize(self):
        self._refuse_in_capture("a device synchronization")
        if not self.simulator:
            import cupy

            cupy.cuda.get_current_stream().synchronize()

    # -- the bus ---------------------------------------------------------------------------------
    def to_host(self, a):
        """A numpy copy of device array ``a`` (counted).  A copy in the simulator too, so code
        that writes into the result and expects the device to change fails here as on a GPU."""
        self._refuse_in_capture("a device->host copy (to_host)")
        if self.simulator:
            out = a.get() if type(a) is SimArray else np.array(a, copy=True)
        else:
            out = self.xp.asnumpy(a)  # waits for the stream: the data must be computed first
        self.transfers._count("d2h", out.nbytes)
        return out

    def from_host(self, a, dtype=None):
        """A new device array holding host array ``a`` (counted)."""
        self._refuse_in_capture("a host->device copy (from_host)")
        if type(a) is SimArray:
            raise TypeError("from_host was handed a device array: it copies host arrays to the device")
        out = self.xp.asarray(np.asarray(a, dtype=dtype))
        self.transfers._count("h2d", out.nbytes)
        return out

    def copy_to_host(self, dev, host):
        """Copy device array ``dev`` into host array ``host`` of the same size (counted): the
        blobs' lazy sync (minicaffe/blob.py's SyncedMemory)."""
        self._refuse_in_capture("a device->host copy (a blob's host side was asked for)")
        dev.get(out=host)
        self.transfers._count("d2h", host.nbytes)

    def copy_from_host(self, host, dev):
        """Copy host array ``host`` into device array ``dev`` of the same size (counted)."""
        self._refuse_in_capture("a host->device copy (a blob written on the host was read by the engine)")
        dev.set(host)
        self.transfers._count("h2d", host.nbytes)

    def scalar(self, value, dtype):
        """A kernel scalar of the arrays' dtype (float32 math stays float32 on the GPU)."""
        return np.dtype(dtype).type(value)


class _Captured:
    """What ``Launcher.capture`` yields: ``graph`` (a cupy.cuda.Graph: ``graph.launch()``) and
    ``stream`` once the capture has ended."""

    graph = None
    stream = None


_launchers = {}


def launcher(simulator=None):
    """The process's launcher for the target numba.cuda gives (or insists on ``simulator``)."""
    sim = is_simulator() if simulator is None else bool(simulator)
    if sim not in _launchers:
        _launchers[sim] = Launcher(sim)
    return _launchers[sim]
