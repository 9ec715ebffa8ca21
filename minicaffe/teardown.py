"""How a minicaffe command's process ends: ``sys.exit`` less the teardown nobody needs.

At ``exit()`` the C libraries' static destructors run, LLVM's among them.  They walk LLVM's global
tables and, doing so, fault ~11 MiB of its machine code back into the process (the code
``minicaffe.memory.jitcode`` released; fault-around maps 64 KiB around each touch), only to free
memory the operating system takes back a moment later.  For ``python -m minicaffe.train lenet``
that was the peak of the whole run (docs/CPU_SPEED.md, "Memory").  So, as compilers skip freeing
their memory at exit, a command ends with :func:`exit_without_teardown`:

1. ``sys.exit(code)``: Python unwinds as ever, waits for non-daemon threads, and runs the
   ``atexit`` handlers (data readers' threads stopped, LevelDB handles closed, mpi4py's
   ``MPI_Finalize``, logging's flush), newest first;
2. the last of them is :func:`_end`, registered when minicaffe is first imported (so after every
   handler registered later): it finalizes MPI if mpi4py started it, flushes ``sys.stdout`` and
   ``sys.stderr`` and calls ``os._exit(code)``.

mpi4py finalizes MPI from a C-level exit hook (``Py_AtExit``), which runs only after the
interpreter's teardown, so ``os._exit`` would skip it.  Under MPICH's ``mpiexec`` a rank that
leaves without ``MPI_Finalize`` counts as a failed rank: the launcher SIGKILLs the ranks still
running (mid-snapshot, perhaps) and may report exit code 9.  Hence ``_end`` calls
``MPI.Finalize()`` itself, which waits for the other ranks as MPI's end does.

Skipped: the interpreter's module teardown and the C ``atexit`` list (LLVM's destructors).  A
library user's process, which never calls this, exits as usual: ``_end`` does nothing then.
"""

import atexit
import os
import sys

_code = None  # set by exit_without_teardown: the status _end exits with


def exit_without_teardown(code):
    """``sys.exit(code)``, ending with ``os._exit`` after the ``atexit`` handlers (see above)."""
    global _code
    code = 0 if code is None else code
    if isinstance(code, int) and sys.platform.startswith("linux"):
        _code = code
    sys.exit(code)


def _finalize_mpi():
    """``MPI.Finalize()`` where mpi4py initialized MPI and nothing finalized it yet (see above)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception as e:  # an MPI error at the very end: say so, keep the exit status
        print(f"minicaffe: MPI_Finalize failed at exit: {e}", file=sys.stderr)


@atexit.register  # minicaffe/__init__ imports this first: handlers run newest first, so this runs last
def _end():
    if _code is None:
        return
    _finalize_mpi()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced: nothing left to flush
            pass
    os._exit(_code)
