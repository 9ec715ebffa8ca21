"""Real-GPU checks, and what the GPU entry points do where there is no GPU.

numba fixes its CUDA target (real or simulator) once per process and the default test run uses
the simulator, so the real-GPU runs happen in fresh processes started with
NUMBA_ENABLE_CUDASIM=0.  They are marked ``gpu`` and skip, saying why, where no GPU is usable.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _why_no_gpu():
    """Asked in a fresh process: this one may already have numba's simulator loaded."""
    r = subprocess.run(
        [sys.executable, "-c", "from minicaffe.backend import _gpu; print(_gpu.why_not('cuda'))"],
        capture_output=True,
        text=True,
        env=_env(NUMBA_ENABLE_CUDASIM="0"),
        cwd=ROOT,
        timeout=120,
    )
    out = r.stdout.strip()
    return None if out == "None" else (out or r.stderr.strip()[-300:])


def test_gpu_benchmark_says_why_and_exits_0_without_a_gpu():
    reason = _why_no_gpu()
    if reason is None:
        pytest.skip("a GPU is usable here: the benchmark runs for real (test_gpu_benchmark_runs)")
    r = subprocess.run(
        [sys.executable, "-m", "kernels.cuda.bench"], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kernels.cuda.bench: no GPU benchmark here --"), r.stdout
    assert "simulator proves correctness, not speed" in r.stdout


@pytest.mark.gpu
def test_gpu_kernel_and_backend_suites_on_the_device():
    """tests/test_cuda_kernels.py and test_cuda_backend.py on the real GPU (their 'cuda' cases)."""
    reason = _why_no_gpu()
    if reason:
        pytest.skip(f"no GPU: {reason}")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "cuda and not cudasim",
            "tests/test_cuda_kernels.py",
            "tests/test_cuda_backend.py",
        ],
        capture_output=True,
        text=True,
        env=_env(NUMBA_ENABLE_CUDASIM="0"),
        cwd=ROOT,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


@pytest.mark.gpu
def test_gpu_benchmark_runs():
    reason = _why_no_gpu()
    if reason:
        pytest.skip(f"no GPU: {reason}")
    r = subprocess.run(
        [sys.executable, "-m", "kernels.cuda.bench", "--size", "512", "--repeat", "3"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "of cuBLAS" in r.stdout and "of copy" in r.stdout
