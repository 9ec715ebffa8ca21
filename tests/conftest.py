import os

import numpy as np
import pytest

from minicaffe import backend as _backend

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
