"""Faults in the threaded runtime: a worker thread that hangs, a stop request while the server
waits for it, a worker whose shard makes the loss NaN.  The run must end promptly, name the
worker and the iteration, and leave a snapshot of the last consistent parameters."""

import threading
import time

import numpy as np
import pytest

from minicaffe import data, proto
from minicaffe.errors import SolverError
from minicaffe.parallel import ParallelTrainer
from minicaffe.parallel.runtime import WorkerTimeout
from minicaffe.solvers import get_solver
from tests.fault_layers import GATE

NET = """
name: "hang"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "hang_set?shuffle=false" batch_size: 8 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "gate" type: "Python" bottom: "ip" top: "gated"
        python_param { module: "tests.fault_layers" layer: "Gate" } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "gated" bottom: "label" top: "loss" }
"""


@pytest.fixture(autouse=True)
def dataset():
    rng = np.random.default_rng(2)
    data.register_dataset("hang_set", rng.integers(0, 256, (64, 1, 3, 3), dtype=np.uint8), rng.integers(0, 3, 64))
    GATE.update(mode=None, calls={})
    GATE["release"].clear()
    yield
    GATE["release"].set()  # let a left-behind thread finish
    data.unregister_dataset("hang_set")


def make_solver(tmp_path, log=None, **fields):
    param = proto.Message("SolverParameter", base_lr=0.05, momentum=0.9, lr_policy="fixed", random_seed=5, display=0)
    param.net_param = proto.parse(NET, "NetParameter")
    param.snapshot_prefix = str(tmp_path / "snap")
    param.max_iter = 50
    for k, v in fields.items():
        setattr(param, k, v)
    return get_solver(param, log=log or (lambda m: None))


def test_a_hung_worker_is_reported_by_name_and_iteration_and_the_run_snapshots(tmp_path):
    GATE["mode"] = "hang"
    lines = []
    solver = make_solver(tmp_path, log=lines.append)
    trainer = ParallelTrainer(solver, 2, worker_timeout=1.0)
    t0 = time.perf_counter()
    with pytest.raises(WorkerTimeout) as info:
        trainer.solve()
    assert time.perf_counter() - t0 < 20  # not the 30 s join of a thread that never ends
    err = info.value
    assert err.worker == 1 and err.iteration == 2  # its 3rd forward: iteration 2
    assert "worker 1 (minicaffe-worker-1)" in str(err) and "iteration 2" in str(err) and "1 s" in str(err)
    # the last consistent parameters: after the 2 updates that completed
    assert solver.iter == 2
    assert (tmp_path / "snap_iter_2.solverstate").exists() and "snap_iter_2" in str(err)
    assert any("left behind" in line for line in lines), lines
    with pytest.raises(SolverError, match="still busy"):
        trainer.step(1)
    # the snapshot resumes
    GATE.update(mode=None)
    GATE["release"].set()
    fresh = make_solver(tmp_path)
    fresh.restore(str(tmp_path / "snap_iter_2.solverstate"))
    for a, b in zip(fresh.net.learnable_params, solver.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)


def test_a_stop_request_is_seen_while_the_server_waits(tmp_path):
    GATE["mode"] = "hang"
    lines = []
    solver = make_solver(tmp_path, log=lines.append)
    trainer = ParallelTrainer(solver, 2)  # the default deadline is far away

    def stop_soon():
        while GATE["calls"].get("minicaffe-worker-1", 0) < GATE["at"]:
            time.sleep(0.01)
        time.sleep(0.3)
        solver.requested_stop = True  # what Ctrl-C / SIGTERM do

    stopper = threading.Thread(target=stop_soon)
    stopper.start()
    t0 = time.perf_counter()
    trainer.solve()
    stopper.join()
    assert time.perf_counter() - t0 < 20
    assert solver.requested_stop and solver.iter == 2
    assert (tmp_path / "snap_iter_2.solverstate").exists()
    text = "\n".join(lines)
    assert "worker 1 (minicaffe-worker-1)" in text and "iteration 2" in text


def test_a_nan_from_one_worker_names_the_worker(tmp_path):
    GATE["mode"] = "nan"
    solver = make_solver(tmp_path)
    with pytest.raises(SolverError, match=r"loss is nan at iteration 2.*worker 1.*layer 'gate'") as info:
        ParallelTrainer(solver, 2).solve()
    assert "base_lr" not in str(info.value)  # the parameters did not diverge


def test_the_train_tool_takes_the_worker_deadline(tmp_path, capsys):
    from minicaffe.tools import train

    GATE["mode"] = "hang"
    solver_file = tmp_path / "hang_solver.prototxt"
    solver_file.write_text(
        'base_lr: 0.05 momentum: 0.9 lr_policy: "fixed" random_seed: 5 display: 0 max_iter: 50\n'
        f'snapshot_prefix: "{tmp_path / "snap"}"\nnet_param {{ {NET} }}\n'
    )
    args = [str(solver_file), "--workers", "2", "--output", str(tmp_path / "run"), "--no-plot"]
    assert train.main(args + ["--worker-timeout", "-1"]) != 0
    assert "--worker-timeout must be a number of seconds >= 0" in capsys.readouterr().err
    t0 = time.perf_counter()
    assert train.main(args + ["--worker-timeout", "1"]) != 0
    assert time.perf_counter() - t0 < 30  # the 1 s deadline, not the default 300 s
    out = capsys.readouterr()
    text = out.out + out.err
    assert "worker 1 (minicaffe-worker-1)" in text and "1 s (worker_timeout)" in text, text
