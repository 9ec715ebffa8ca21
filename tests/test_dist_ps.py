"""The sharded parameter server, in process over loopback sockets: BSP across P nodes computes what
one process computes on the same global batch (Caffe's LeNet solver: momentum, weight decay, the
inv lr policy), for even and uneven shards, with worker threads inside the nodes, with other update
rules and with global gradient clipping; SSP keeps the replicas identical; node 0's snapshot
resumes in one process."""

import os

import numpy as np
import pytest

from minicaffe.dist.local import run_nodes
from minicaffe.dist.ps import blob_names
from minicaffe.net import load_net_param
from minicaffe.parallel.replica import with_synthetic_data
from minicaffe.solvers import get_solver, load_solver_param

K = 3  # iterations compared
NETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")


def lenet_solver(tmp_path=None, batch=None, **fields):
    param, _ = load_solver_param(os.path.join(NETS, "lenet_solver.prototxt"))
    net = with_synthetic_data(load_net_param(os.path.join(NETS, "lenet_train_test.prototxt")), count=256)
    if batch:
        for lp in net.layer:
            if lp.type == "Data" and "TRAIN" in str(lp.include):
                lp.data_param.batch_size = batch
    param.clear("net")
    param.net_param = net
    param.random_seed = 7
    param.display = 0
    param.test_interval = 0
    param.clear("test_iter")
    param.max_iter = K
    param.snapshot = 0
    param.snapshot_after_train = False
    param.snapshot_prefix = str(tmp_path / "lenet") if tmp_path else "lenet"
    for k, v in fields.items():
        setattr(param, k, v)
    return get_solver(param, log=lambda m: None)


def params_of(solver):
    return [p.data.copy() for p in solver.net.learnable_params]


def assert_close(a, b, atol=1e-4):
    for i, (x, y) in enumerate(zip(a, b)):
        err = float(np.abs(x - y).max())
        assert err <= atol, f"parameter {i}: max |difference| {err:.3g} > {atol}"


@pytest.fixture(scope="module")
def reference():
    s = lenet_solver()
    s.step(K)
    return params_of(s)


@pytest.mark.parametrize("world", [2, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_bsp_equals_one_process(reference, world):
    solvers = [lenet_solver() for _ in range(world)]
    nodes = run_nodes(solvers, iters=K)
    for s in solvers:
        assert_close(params_of(s), reference)
    # every node saw the traffic of 1/P of every blob, each way
    rep = nodes[0].reports
    assert sorted(rep) == list(range(world))
    total = sum(p.count for p in solvers[0].net.learnable_params) * 4
    sent = sum(v["sent"] for v in rep[1]["layers"].values())
    # node 1 sends (P-1)/P of every gradient and (P-1) copies of its shard of the parameters
    expected = K * 2 * total * (world - 1) / world
    assert abs(sent - expected) / expected < 0.05, (sent, expected)


def test_uneven_shards_and_threads_inside_nodes():
    ref = lenet_solver(batch=61)
    ref.step(K)
    solvers = [lenet_solver(batch=61) for _ in range(3)]  # 61 = 21 + 20 + 20 images, split again by 2 threads
    run_nodes(solvers, iters=K, workers=2)
    for s in solvers:
        assert_close(params_of(s), params_of(ref))


@pytest.mark.parametrize("kind", [pytest.param("Adam", marks=pytest.mark.slow), "clip"])
def test_other_rules_and_global_clipping(kind):
    fields = {"type": "Adam", "base_lr": 0.001, "momentum": 0.9, "momentum2": 0.999, "lr_policy": "fixed"}
    if kind == "clip":
        fields = {"clip_gradients": 0.05}
    ref = lenet_solver(**fields)
    ref.step(K)
    solvers = [lenet_solver(**fields) for _ in range(2)]
    run_nodes(solvers, iters=K)
    for s in solvers:
        assert_close(params_of(s), params_of(ref))


@pytest.mark.slow
def test_ssp_keeps_replicas_identical():
    solvers = [lenet_solver(max_iter=4) for _ in range(3)]
    run_nodes(solvers, iters=4, staleness=1)
    first = params_of(solvers[0])
    for s in solvers[1:]:
        for a, b in zip(first, params_of(s)):
            np.testing.assert_array_equal(a, b)  # the last iteration is synchronized exactly


def test_snapshot_of_node_zero_resumes_in_one_process(tmp_path):
    solvers = [lenet_solver(tmp_path, max_iter=2, snapshot=2) for _ in range(2)]
    run_nodes(solvers, iters=2)
    state = tmp_path / "lenet_iter_2.solverstate"
    assert state.exists()
    one = lenet_solver(max_iter=K)
    one.restore(str(state))
    one.step(1)
    ref = lenet_solver(max_iter=K)
    ref.step(K)
    assert_close(params_of(one), params_of(ref))


def test_blob_names():
    assert blob_names(lenet_solver().net) == [
        "conv1/w",
        "conv1/b",
        "conv2/w",
        "conv2/b",
        "ip1/w",
        "ip1/b",
        "ip2/w",
        "ip2/b",
    ]
