"""Load a run's kernels before its arrays exist.

A training run loads each kernel it calls from numba's cache the first time it calls it: ~30 for
LeNet, all on the first iteration and the first test.  Every load runs LLVM: its code faults in
(~10 MiB of ``libllvmlite.so``) and is released again after the load (jitcode.py).  On the first
iteration those pages come on top of everything the run already holds (the arena being touched,
the kernels loaded before), so the last load sets the run's peak, ~10 MiB above the steady state.

Loaded before the nets are built, the same kernels cost the same time and the same resident code,
but their LLVM pages come and go while the process is small.  Which kernels a run will load is
known only once it has run, so the train tool writes them down: after a run, the signatures of
the kernels it loaded go to a small file beside numba's cache (``preload-<key>.pkl``, the
key a hash of what decides them: the nets' definitions and the train tool's settings), and a
later run with the same key loads them first.

    key = preload.key(net_text, settings)
    preload.load(key)          # before the nets are built: the number of kernels loaded
    ...                        # the run
    preload.save(key)          # the kernels loaded now, for the next run (if fresh() at the start)

A kernel is found by its module and name (module-level numba dispatchers of ``kernels`` and
``minicaffe``), a signature is numba's types (pickled, as numba's own cache index keeps them).
A module whose code calls symbols registered at run time declares ``preload_prepare()``
(registers them, says whether it could; where one cannot, nothing is preloaded).  Each entry
keeps its source file's size and time: an entry whose file changed is skipped (its kernel loads,
or compiles, on the first iteration as it would without this file).  The files go where numba
would put its cache: ``NUMBA_CACHE_DIR`` if set, else this package's ``__pycache__``, else
``~/.cache/minicaffe``.  A missing, unreadable or stale file costs nothing but the peak it would
have saved.  The train tool reads and writes a list only in a process that is the run
(``fresh()``): a run inside a notebook or a test session would list everything loaded before it.
Measured with ``python benchmarks/memory.py`` (docs/CPU_SPEED.md, "Memory").
"""

import hashlib
import os
import pickle
import sys

import numba
from numba.core.registry import CPUDispatcher

VERSION = 1
PACKAGES = ("kernels", "minicaffe")


def _directory():
    """Where the lists go, by numba's own rule for its cache: ``NUMBA_CACHE_DIR`` if set, else
    this package's ``__pycache__`` where it can be written, else the user's cache directory."""
    if numba.config.CACHE_DIR:
        return os.path.join(numba.config.CACHE_DIR, "minicaffe-preload")
    here = os.path.dirname(os.path.abspath(__file__))
    if os.access(here, os.W_OK):
        return os.path.join(here, "__pycache__")
    return os.path.join(os.path.expanduser("~"), ".cache", "minicaffe")


def key(*parts):
    """A short hash of what decides which kernels a run loads (any str()-able parts)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def path(run_key):
    """The list's file for ``run_key``."""
    return os.path.join(_directory(), f"preload-{run_key}.pkl")


def _stamp(module):
    try:
        st = os.stat(module.__file__)
    except (AttributeError, TypeError, OSError):
        return None
    return (st.st_size, st.st_mtime_ns)


def loaded():
    """[(module name, attribute name, source stamp, signature)] of every signature loaded now by
    the module-level numba kernels of minicaffe's packages."""
    out = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                out.extend((name, attr, _stamp(module), sig) for sig in value.signatures)
    return out


def fresh():
    """Whether no kernel of minicaffe's packages has been loaded in this process yet, beyond
    ``jitcode.first_kernel`` (numba's runtime): a process that is only this run, as the train
    tool's command is.  A run inside a longer-lived process (a notebook, a test session) would
    list what everything before it loaded, so only a fresh process's list is written."""
    return all(name == "minicaffe.memory.jitcode" for name, _, _, _ in loaded())


def save(run_key):
    """Write the kernels loaded now for ``run_key``'s next run; True if written.  Nothing is
    written when the file already lists them all, nor where the cache directory is not writable.
    Call it only for a run that started in a ``fresh()`` process."""
    target = path(run_key)
    entries = loaded()
    try:
        with open(target, "rb") as f:
            before = pickle.load(f)
        if before.get("version") == VERSION and set(map(_entry_id, entries)) <= set(map(_entry_id, before["kernels"])):
            return False
    except Exception:  # absent, unreadable or written by other code: written anew
        pass
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "wb") as f:
            pickle.dump({"version": VERSION, "kernels": entries}, f)
        os.replace(tmp, target)  # a reader sees the old file or the new one, never half of one
    except Exception:  # not writable, or a signature that does not pickle: the next run goes without
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def _entry_id(entry):
    name, attr, stamp, sig = entry
    return (name, attr, stamp, str(sig))


def load(run_key):
    """Load (from numba's cache; compile where the cache lacks one) each kernel signature the last
    run with ``run_key`` loaded, skipping those whose source changed since; returns the number
    loaded.  Never raises: a kernel that cannot be loaded now loads when the run calls it."""
    target = path(run_key)
    if not os.path.exists(target):
        return 0
    try:
        with open(target, "rb") as f:
            data = pickle.load(f)
        entries = data["kernels"] if data.get("version") == VERSION else []
    except Exception:  # unreadable (a numba that pickles types otherwise, a damaged file): skipped
        return 0
    modules = {}
    for name in dict.fromkeys(entry[0] for entry in entries):
        try:
            if name.split(".")[0] in PACKAGES:
                __import__(name)
                modules[name] = sys.modules[name]
        except Exception:  # a module gone or renamed: its kernels are skipped
            continue
    # a module whose compiled code calls symbols registered at run time (kernels/cblas.py) says
    # whether they are registered now: loading code that calls a missing symbol aborts the process
    # (LLVM ERROR), so where one says no, nothing is preloaded
    for name, module in list(sys.modules.items()):  # those imported, and what they import
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        prepare = getattr(module, "preload_prepare", None)
        try:
            if prepare is not None and not prepare():
                return 0
        except Exception:
            return 0
    count = 0
    for name, attr, stamp, sig in entries:
        module = modules.get(name)
        try:
            if module is None:
                continue
            dispatcher = getattr(module, attr, None)
            if not isinstance(dispatcher, CPUDispatcher) or _stamp(module) != stamp:
                continue
            if tuple(sig) in dispatcher.signatures:
                continue  # loaded already (a process that ran before): no lock, no LLVM release
            dispatcher.compile(sig)
            count += 1
        except Exception:  # a signature the kernel no longer takes, ...: it loads when called
            continue
    return count
