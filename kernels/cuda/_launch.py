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

The launcher also counts host<->device copies (``Transfers``): ``to_host``/``from_host`` and the
blobs' lazy syncs (``copy_to_host``/``copy_from_host``) are the engine's only sanctioned ways
across the bus, and the tests read the counter to prove that a training step makes no hidden
round trips.
"""

import math
import threading
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from .simarray import SimArray


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
    ``gemm_grid``: cap on each grid axis of the 2-d GEMM grids."""

    threads: int = 256
    max_blocks: int = 8192
    gemm_tile: int = 16
    regblock: tuple = (128, 128, 8, 8, 8)
    row_threads: int = 128
    gemm_grid: int = 65535


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
        if self.simulator:
            with self._sim_lock:
                kernel[grid, block, 0](*[self._arg(a) for a in args])
            return
        kernel[grid, block, self.stream()](*[self._arg(a) for a in args])

    def synchronize(self):
        if not self.simulator:
            import cupy

            cupy.cuda.get_current_stream().synchronize()

    # -- the bus ---------------------------------------------------------------------------------
    def to_host(self, a):
        """A numpy copy of device array ``a`` (counted).  A copy in the simulator too, so code
        that writes into the result and expects the device to change fails here as on a GPU."""
        if self.simulator:
            out = a.get() if type(a) is SimArray else np.array(a, copy=True)
        else:
            out = self.xp.asnumpy(a)  # waits for the stream: the data must be computed first
        self.transfers._count("d2h", out.nbytes)
        return out

    def from_host(self, a, dtype=None):
        """A new device array holding host array ``a`` (counted)."""
        if type(a) is SimArray:
            raise TypeError("from_host was handed a device array: it copies host arrays to the device")
        out = self.xp.asarray(np.asarray(a, dtype=dtype))
        self.transfers._count("h2d", out.nbytes)
        return out

    def copy_to_host(self, dev, host):
        """Copy device array ``dev`` into host array ``host`` of the same size (counted): the
        blobs' lazy sync (minicaffe/blob.py's SyncedMemory)."""
        dev.get(out=host)
        self.transfers._count("d2h", host.nbytes)

    def copy_from_host(self, host, dev):
        """Copy host array ``host`` into device array ``dev`` of the same size (counted)."""
        dev.set(host)
        self.transfers._count("h2d", host.nbytes)

    def scalar(self, value, dtype):
        """A kernel scalar of the arrays' dtype (float32 math stays float32 on the GPU)."""
        return np.dtype(dtype).type(value)


_launchers = {}


def launcher(simulator=None):
    """The process's launcher for the target numba.cuda gives (or insists on ``simulator``)."""
    sim = is_simulator() if simulator is None else bool(simulator)
    if sim not in _launchers:
        _launchers[sim] = Launcher(sim)
    return _launchers[sim]
