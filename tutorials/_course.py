"""What every lesson shares: quick mode, where figures go, showing a figure, a scratch directory.

A lesson runs three ways: as a script (``python tutorials/03_im2col.py``), cell by cell in
Jupyter or VS Code (the ``# %%`` markers), and under ``python -m tutorials.render``.  This module
hides the differences: ``show(fig, name)`` saves the figure as a PNG and leaves it open where a
notebook will display it (and closes it in a plain script run).
"""

import atexit
import os
import shutil
import sys
import tempfile

import matplotlib

if "ipykernel" not in sys.modules and os.environ.get("MPLBACKEND") is None:
    matplotlib.use("Agg")  # a script or the renderer: no window, just files
import matplotlib.pyplot as plt  # noqa: E402

#: quick mode (the tests, CI): small sizes, few iterations; the claims are the same
QUICK = os.environ.get("MINICAFFE_TUTORIAL_QUICK") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: where figures are written (``MINICAFFE_TUTORIAL_FIGURES`` or tutorials/_build/figures)
FIG = os.environ.get("MINICAFFE_TUTORIAL_FIGURES") or os.path.join(ROOT, "tutorials", "_build", "figures")


def _in_notebook():
    return "ipykernel" in sys.modules or os.environ.get("MINICAFFE_TUTORIAL_RENDER") == "1"


def show(fig, name):
    """Save ``fig`` as FIG/<name>.png; display it in a notebook, close it in a script."""
    os.makedirs(FIG, exist_ok=True)
    path = os.path.join(FIG, name + ".png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"[figure {name}.png]")
    if not _in_notebook():
        plt.close(fig)
    return path


def scratch(prefix):
    """A fresh temporary directory, removed when the process exits (or by ``cleanup``)."""
    path = tempfile.mkdtemp(prefix=f"minicaffe-{prefix}-")
    _scratch.append(path)
    return path


_scratch = []


@atexit.register
def cleanup():
    """Remove every directory ``scratch`` made (a lesson's last cell calls it)."""
    while _scratch:
        shutil.rmtree(_scratch.pop(), ignore_errors=True)


def size(quick, full):
    """``quick`` in quick mode, else ``full``."""
    return quick if QUICK else full


def timeit(fn, repeat=5, warmup=1):
    """Median seconds of ``fn()`` over ``repeat`` runs, after ``warmup`` runs (numba compiles
    on the first call; the median ignores a run the machine's other work slowed down)."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(nbytes, repeat=5):
    """Bytes per second of ``np.copyto`` between two arrays of ``nbytes`` (read + write counted),
    from the fastest of ``repeat`` runs: the ceiling for any kernel that streams through memory
    once (the fastest run is the one the machine's other work disturbed least)."""
    import time

    import numpy as np

    a = np.ones(max(nbytes // 4, 1), np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def versions_doc(module):
    """The "Versions:" section of a kernel family's docstring (each rung's idea, in its own
    words), so a lesson shows what the code says today."""
    doc = module.__doc__ or ""
    start = doc.find("Versions")
    if start < 0:
        return "(no Versions section in the docstring)"
    text = doc[start:]
    for stop in ("\nSee ", "\n\n\n", "\nTile sizes", "\nThe "):
        if stop in text:
            text = text[: text.index(stop)]
    return text.rstrip()
