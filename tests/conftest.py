import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import pytest

from minicaffe import backend as _backend

pytest_plugins = ["pytester"]  # tests/test_userday.py runs small pytest sessions with this conftest

# The real-GPU backend ("cuda") is left out here: numba picks its real CUDA target or its
# simulator once per process, so one pytest process can run "cpu" + "cudasim" (the default) or
# "cpu" + "cuda", not all three; tests/test_cuda_gpu.py runs the GPU checks in a process of their
# own.  "cudasim" is the GPU code path run by numba's CUDA simulator: loading it switches numba to
# the simulator for this process (minicaffe/backend/_gpu.py), so no environment variable is needed.
# With NUMBA_ENABLE_CUDASIM=0 set explicitly (a machine with a GPU), the same tests run on "cuda".
_GPU = "cuda" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "0" else "cudasim"


@pytest.fixture(params=[name for name in _backend.BACKENDS if name in ("cpu", _GPU)])
def backend(request):
    """Every backend the engine has: one test definition runs on each."""
    reason = _backend.why_not(request.param)
    if reason is not None:
        pytest.skip(f"backend {request.param}: {reason}")
    return _backend.get(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- real-GPU cases: one reason that makes sense on a machine without a GPU -----------------------
def _why_no_gpu():
    """None if CuPy sees an NVIDIA GPU, else why not (asks CuPy only: numba's CUDA target is
    fixed once per process, and the default run uses its simulator for the "cudasim" cases)."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError, a missing driver library
        return f"CuPy sees no usable NVIDIA GPU ({type(exc).__name__})"
    return None if n > 0 else "there is no NVIDIA GPU on this machine"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _why_no_gpu()
    if reason is None:
        return  # a GPU is here: the cases run, or say themselves why not in this process
    skip = pytest.mark.skip(
        reason=f"needs a real NVIDIA GPU ({reason}); the same kernels are tested in numba's CUDA "
        f"simulator by the 'cudasim' cases of this run"
    )
    for item in gpu_items:
        item.add_marker(skip)


# -- one temporary directory for the whole run, removed at its end --------------------------------
def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "nan_expected: the test makes values overflow or become NaN on purpose (numpy's "
        "RuntimeWarnings are silenced for it, and only for it)",
    )
    if hasattr(config, "workerinput"):
        return
    # pytest's own tmp_path directories stay where pytest keeps them (the last three runs)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    _remove_stale_roots(tempfile.gettempdir())
    root = tempfile.mkdtemp(prefix=f"minicaffe-tests-{os.getpid()}-")
    config.stash[_TMP_KEY] = (root, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = root  # subprocesses too
    tempfile.tempdir = root


_TMP_KEY = pytest.StashKey()


def _remove_stale_roots(parent):
    """The directories of earlier runs that were killed before they could clean up (their
    process is gone); those of runs still going are left alone."""
    for name in os.listdir(parent):
        parts = name.split("-")
        if name.startswith("minicaffe-tests-") and len(parts) >= 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            except PermissionError:
                pass  # another user's process: alive


def pytest_unconfigure(config):
    if _TMP_KEY not in config.stash:
        return
    root, old_env, old_tempdir = config.stash[_TMP_KEY]
    tempfile.tempdir = old_tempdir
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env
    left = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if left:  # a leak worth fixing where it happens; the run still leaves nothing behind
        shown = ", ".join(left[:5]) + (", ..." if len(left) > 5 else "")
        print(f"\nconftest: removed what tests left in the temporary directory: {shown}", file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _expected_nan(request):
    if request.node.get_closest_marker("nan_expected") is None:
        yield
        return
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, message=".*(overflow|invalid value|divide)")
        yield
