"""The MPI transport (mpi4py + MPICH): the parameter server over MPI computes what one process
computes (BSP, Caffe's LeNet solver, 2 and 3 ranks), and ``mpiexec -n 2 python -m minicaffe.train
... --dist mpi`` trains.  Skipped with the reason where mpi4py or mpiexec is missing."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import mpi4py  # noqa: F401

    MPIEXEC = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    WHY = None if os.path.exists(MPIEXEC) else "mpiexec not found next to the Python interpreter or on PATH"
except ImportError:
    MPIEXEC, WHY = None, "mpi4py is not installed (pip install 'minicaffe[mpi]')"

pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

CHECK = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_dist_ps import K, lenet_solver, params_of
from minicaffe.dist.launch import config_hashes
from minicaffe.dist.mpi import MPITransport
from minicaffe.dist.ps import Node

solver = lenet_solver()
limit = max(p.count for p in solver.net.learnable_params) * 4
t = MPITransport(config_hashes(solver), limit, log=lambda m: None)
node = Node(solver, t)
node.attach_solver()
node.start()
solver.step(K)
reports = node.finish()
ref = lenet_solver()
ref.step(K)
err = max(float(np.abs(a - b).max()) for a, b in zip(params_of(solver), params_of(ref)))
sent = reports[t.rank]["bytes_sent"]
print(f"rank {{t.rank}} of {{t.world}}: max difference {{err:.3g}}, sent {{sent}} bytes, reports {{sorted(reports)}}")
sys.exit(0 if err <= 1e-4 and sent > 0 else 3)
"""


def mpiexec(n, args, cwd, timeout=240):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_bsp_over_mpi_equals_one_process(tmp_path, n):
    script = tmp_path / "check.py"
    script.write_text(CHECK.format(tests=os.path.join(ROOT, "tests")))
    r = mpiexec(n, [sys.executable, str(script)], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("max difference") == n
    assert f"reports {list(range(n))}" in r.stdout  # rank 0 has every rank's statistics


@pytest.mark.slow
def test_train_tool_over_mpi(tmp_path):
    from test_dist_faults import write_solver

    solver = write_solver(tmp_path)
    r = mpiexec(2, [sys.executable, "-m", "minicaffe.train", solver, "--dist", "mpi", "--iters", "4", "--no-plot",
                    "--output", str(tmp_path / "run")], str(tmp_path))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node 0/2: MPI" in r.stdout and "MB/iteration" in r.stdout


LEAVE = """
import sys
import time
from mpi4py import MPI
from minicaffe.teardown import exit_without_teardown

rank = MPI.COMM_WORLD.Get_rank()
if rank == {late}:
    time.sleep(1.0)  # the other rank leaves first
with open(f"rank{{rank}}.done", "w") as f:
    f.write("finished")
print(f"rank {{rank}} finished", flush=True)
exit_without_teardown(0)
"""


@pytest.mark.parametrize("late", [0, 1])
def test_exit_without_teardown_finalizes_mpi(tmp_path, late):
    # minicaffe's commands end with os._exit (minicaffe/teardown.py), which skips mpi4py's C-level
    # MPI_Finalize: MPICH's launcher then killed the rank still working (exit code 9 in CI)
    script = tmp_path / "leave.py"
    script.write_text(LEAVE.format(late=late))
    r = mpiexec(2, [sys.executable, str(script)], str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.glob("rank*.done")) == ["rank0.done", "rank1.done"], r.stdout + r.stderr
    assert "BAD TERMINATION" not in r.stdout + r.stderr
