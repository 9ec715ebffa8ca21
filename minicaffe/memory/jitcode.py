"""LLVM's machine code resident only while numba compiles.

numba compiles (or loads from its on-disk cache) every kernel with LLVM, which llvmlite ships as
one shared library, ``libllvmlite.so``: about 80 MiB of machine code.  Like every shared library
it is mapped into the process and paged in as it runs; and the kernel maps more than the page a
call touches (fault-around: the page cache's neighbours, up to 64 KiB around each fault), so a
process that imported numba and loaded one cached kernel holds 69-73 MiB of LLVM's code, half
its resident memory, though a training step never runs a line of it.

These pages are clean and file-backed: the bytes are the library file's, kept in the page cache.
``release_llvm_code`` hands them back with ``madvise(MADV_DONTNEED)``; they leave the process's
resident set (its RSS, ``VmRSS``, really falls: nothing is hidden from the measurement) and, if
LLVM runs again, fault back in from the page cache, as they came the first time.  Only read-only
mappings holding no private (anonymous) page are released: the relocated, written-once part of
the library stays.

    with keep_llvm_code_out():          # the train tool's run
        load_jit_runtime()              # numba's runtime and LLVM's JIT engine, before big arrays
        ...                             # every compile or cache load ends with LLVM released again

A kernel loaded from numba's cache also keeps a parsed copy of its LLVM module beside its machine
code (``CPUCodeLibrary._shared_module``), used only if a kernel compiled later calls it and links
it in: ~4.4 MiB of heap for the ~30 kernels of a LeNet run.  ``keep_llvm_code_out`` drops these
copies as each kernel loads and keeps the module's bitcode instead (~1 MiB for all of them, the
bytes the cache held), parsed again only if a compile ever links it (``drop_linking_modules``).

``keep_llvm_code_out`` listens to numba's documented event API (``numba.core.event``, the
``numba:compiler_lock`` event): whenever a thread leaves the outermost compiler lock, the pages
LLVM touched are released.  A training step takes that lock only on its first iteration (as each
kernel loads from the cache), so the steps that follow never pay for it.

Measured with ``python benchmarks/memory.py`` (docs/CPU_SPEED.md, "Memory").  Linux only;
elsewhere every function here does nothing and says so (returns 0 or False).
"""

import contextlib
import ctypes
import mmap
import os
import sys
import threading
import weakref

import numba
import numba.core.event
import numpy as np

# the shared library LLVM lives in: llvmlite's wheels link LLVM statically into libllvmlite.so;
# a build against a system LLVM loads libLLVM(-NN).so beside it
LLVM_LIBRARIES = ("libllvmlite", "libLLVM")


def _is_llvm(path):
    return os.path.basename(path).startswith(LLVM_LIBRARIES)


def llvm_mappings(smaps_path="/proc/self/smaps"):
    """The process's mappings of LLVM's library: [{start, end, perms, path, Rss, Anonymous,
    Private_Dirty, Shared_Dirty}] (sizes in KiB, as smaps gives them); [] where /proc is absent."""
    try:
        with open(smaps_path) as f:
            text = f.read()
    except OSError:
        return []
    out, cur = [], None
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end perms ... path
            fields = rest.split(None, 4)
            path = fields[4] if len(fields) > 4 else ""
            cur = None
            if _is_llvm(path):
                start, end = (int(x, 16) for x in head.split("-"))
                cur = {"start": start, "end": end, "perms": fields[0], "path": path}
                out.append(cur)
        elif cur is not None and head in ("Rss:", "Anonymous:", "Private_Dirty:", "Shared_Dirty:"):
            cur[head[:-1]] = int(rest.split()[0])
    return out


def resident_llvm_bytes():
    """Bytes of LLVM's library resident in this process now (0 where it cannot be read)."""
    return sum(m.get("Rss", 0) for m in llvm_mappings()) * 1024


def releasable(mapping):
    """Whether a mapping may be dropped and read back from its file: read-only and no private
    page (the relocated part of a library is read-only after loading but holds written pages)."""
    written = mapping.get("Anonymous", 0) + mapping.get("Private_Dirty", 0) + mapping.get("Shared_Dirty", 0)
    return "w" not in mapping["perms"] and written == 0


_madvise = None


def _libc_madvise():
    global _madvise
    if _madvise is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        _madvise = libc.madvise
    return _madvise


def release_llvm_code():
    """Hand LLVM's resident code pages back to the page cache; the bytes released (0 if none, or
    not on Linux).  Safe at any time, from any thread: a page LLVM needs again faults back in."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    madvise = _libc_madvise()
    released = 0
    for m in llvm_mappings():
        if m.get("Rss", 0) and releasable(m):
            if madvise(m["start"], m["end"] - m["start"], mmap.MADV_DONTNEED) == 0:
                released += m["Rss"] * 1024
    return released


@numba.njit(cache=True)
def first_kernel(x):
    """The kernel ``load_jit_runtime`` loads: any would do (x[0] += 1)."""
    x[0] += 1.0


def load_jit_runtime(release=True):
    """Load one tiny cached kernel, so that what numba builds once per process (its runtime
    module, compiled by LLVM, and LLVM's JIT engine: ~48 MiB of LLVM's code touched, ~16 MiB of
    heap kept) exists before the nets' arrays do; then release LLVM's code.  Returns the bytes
    released."""
    first_kernel(np.zeros(1))
    return release_llvm_code() if release else 0


class _ReleaseAfterCompiling(numba.core.event.Listener):
    """A numba event listener: releases LLVM's code when a thread leaves the outermost
    ``numba:compiler_lock`` (every compile and every load from numba's cache holds it)."""

    def __init__(self):
        self.depth = threading.local()
        self.released = 0  # bytes, summed over the releases (a page may be counted twice)
        self.count = 0

    def on_start(self, event):
        self.depth.n = getattr(self.depth, "n", 0) + 1

    def on_end(self, event):
        self.depth.n = getattr(self.depth, "n", 1) - 1
        if self.depth.n == 0:
            self.released += release_llvm_code()
            self.count += 1


# -- the parsed LLVM module a cached kernel keeps for linking ------------------------------------
# numba's CPUCodeLibrary: ``_unserialize`` builds a kernel's library from its cache entry (machine
# code and the bitcode of the module to link into other kernels, parsed at once into
# ``_shared_module``); ``_get_module_for_linking`` returns that module when a kernel being compiled
# calls this one.  Both are numba internals (checked by tests/test_memory_jitcode.py): where they
# are missing, nothing is dropped.
_drop_depth = 0  # how many drop_linking_modules blocks are open, in any thread
_patched = False
_patch_lock = threading.Lock()
_dropped = weakref.WeakKeyDictionary()  # library -> its linking module's bitcode, while not parsed


def dropped_bitcode(library):
    """The bitcode a numba code library loaded inside ``drop_linking_modules`` keeps instead of its
    parsed linking module, or None (not dropped, or parsed back since)."""
    return _dropped.get(library)


def _codegen_class():
    from numba.core import codegen

    cls = getattr(codegen, "CPUCodeLibrary", None)
    ok = cls is not None and hasattr(cls, "_unserialize") and hasattr(cls, "_get_module_for_linking")
    return cls if ok else None


def _patch_codegen():
    """Wrap numba's two methods once per process (idempotent): a library loaded inside a
    ``drop_linking_modules`` block (in any thread) keeps its linking module's bitcode, not the
    parsed module; asked for the module, it parses the bitcode back first.  Outside a block
    nothing changes."""
    global _patched
    with _patch_lock:
        cls = _codegen_class()
        if _patched or cls is None:
            return _patched
        unserialize = cls._unserialize.__func__
        module_for_linking = cls._get_module_for_linking

        def _unserialize(klass, codegen, state):
            library = unserialize(klass, codegen, state)
            name, kind, data = state
            if _drop_depth and kind == "object" and getattr(library, "_shared_module", None) is not None:
                _dropped[library] = data[1]  # the bytes the cache entry held
                library._shared_module = None  # the parsed module goes with its last reference
            return library

        def _get_module_for_linking(self):
            bitcode = _dropped.pop(self, None)
            if bitcode is not None and self._shared_module is None:
                import llvmlite.binding as ll

                self._shared_module = ll.parse_bitcode(bitcode)
            return module_for_linking(self)

        cls._unserialize = classmethod(_unserialize)
        cls._get_module_for_linking = _get_module_for_linking
        _patched = True
        return True


@contextlib.contextmanager
def drop_linking_modules():
    """Within the block, every kernel loaded from numba's cache (by any thread: the lanes load
    theirs) keeps its linking module as bitcode instead of a parsed LLVM module; a kernel compiled
    later that calls it parses it back.  Yields whether numba's internals were found (False:
    nothing is dropped)."""
    global _drop_depth
    ok = _patch_codegen()
    with _patch_lock:
        _drop_depth += 1
    try:
        yield ok
    finally:
        with _patch_lock:
            _drop_depth -= 1


@contextlib.contextmanager
def keep_llvm_code_out():
    """Within the block, LLVM's code is released after every compile and every cache load, and
    once on entry, and kernels loaded from the cache keep no parsed linking module
    (``drop_linking_modules``); yields the listener (its ``count`` of releases, ``released``
    bytes)."""
    listener = _ReleaseAfterCompiling()
    numba.core.event.register("numba:compiler_lock", listener)
    try:
        with drop_linking_modules():
            listener.released += release_llvm_code()
            yield listener
    finally:
        numba.core.event.unregister("numba:compiler_lock", listener)
