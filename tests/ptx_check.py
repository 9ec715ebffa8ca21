"""Compiling kernels to PTX in a fresh process, for the tests that check generated GPU code.

The test process runs numba's CUDA simulator; ``numba.cuda.compile_ptx`` needs numba's real CUDA
target and NVVM (a CUDA toolkit's libnvvm), not a GPU.  So a test hands a script to
:func:`compile_in_subprocess`, which runs it with the simulator switched off and the repository
on the path, and reads back the JSON the script prints on its last ``RESULT `` line.  Where no
NVVM is found the calling test skips, saying why.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def real_cuda_env():
    """This process's environment with numba's real CUDA target and the repository importable."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def nvvm_missing_reason():
    """None where numba can load NVVM, else a one-line reason to skip."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "from numba.cuda.cudadrv import nvvm; nvvm.NVVM()"],
            capture_output=True,
            text=True,
            env=real_cuda_env(),
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return "probing NVVM timed out"
    if out.returncode != 0:
        return "numba finds no NVVM (a CUDA toolkit's libnvvm) here: " + out.stderr.strip()[-200:]
    return None


def compile_in_subprocess(script, what, timeout):
    """Run ``script`` (numba's real CUDA target) and return the JSON of its last ``RESULT `` line;
    skips the calling test where there is no NVVM, fails saying ``what`` did not compile."""
    reason = nvvm_missing_reason()
    if reason:
        pytest.skip(reason)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=real_cuda_env(),
        cwd=ROOT,
        timeout=timeout,
    )
    assert r.returncode == 0, f"compiling {what} to PTX failed:\n{r.stderr[-4000:]}"
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])
