"""The SingleCaffe runtime, in process: N workers under BSP equal one thread on the whole batch;
SSP keeps its staleness bound; snapshots and resume are exact; a failing worker and Ctrl-C stop
every thread cleanly; replicas share one parameter vector."""

import os
import signal
import threading

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import data, proto
from minicaffe.memory.report import report_text
from minicaffe.parallel import ParallelTrainer, WorkerError, blas, shard_bounds, shard_sizes, train_with_workers
from minicaffe.solvers import get_solver

NET = """
name: "small"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "par_set?shuffle=false" batch_size: BATCH } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture(autouse=True)
def dataset():
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, size=(96, 1, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 5, size=96)
    data.register_dataset("par_set", images, labels)
    yield
    data.unregister_dataset("par_set")


def make_solver(tmp_path, batch=12, log=None, **fields):
    param = proto.Message(
        "SolverParameter", base_lr=0.05, momentum=0.9, weight_decay=0.001, lr_policy="fixed", random_seed=5, display=0
    )
    param.net_param = proto.parse(NET.replace("BATCH", str(batch)), "NetParameter")
    param.snapshot_prefix = str(tmp_path / "snap")
    param.snapshot_after_train = False
    for k, v in fields.items():
        setattr(param, k, v)
    return get_solver(param, log=log or (lambda m: None))


def params_of(solver):
    return [p.data.copy() for p in solver.net.learnable_params]


def assert_params_close(a, b, rtol=1e-4, atol=1e-5):
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"parameter {i}")


def no_worker_threads(trainer):
    """None of ``trainer``'s worker threads is alive (checked on its own threads: other tests'
    trainers may still have theirs parked until they are garbage collected)."""
    return not trainer.worker_threads()


def test_shards_cover_the_batch():
    assert shard_sizes(64, 2) == [32, 32]
    assert shard_sizes(64, 3) == [22, 21, 21]
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]


@pytest.mark.parametrize("n, server_computes", [(1, True), (2, True), (3, True), (1, False), (2, False)])
def test_bsp_equals_one_thread_on_the_whole_batch(tmp_path, n, server_computes):
    serial = make_solver(tmp_path)
    serial.step(6)
    par = make_solver(tmp_path)
    with ParallelTrainer(par, n, server_computes=server_computes) as trainer:
        trainer.step(6)
        # parked until close; by default the calling thread computes worker 0's shard itself
        assert len(trainer.worker_threads()) == (n - 1 if server_computes else n)
    assert par.iter == 6
    if n == 1:  # the same sums in the same order: bit-exact
        for x, y in zip(params_of(serial), params_of(par)):
            np.testing.assert_array_equal(x, y)
    assert_params_close(params_of(serial), params_of(par))
    assert abs(serial.smoothed_loss - par.smoothed_loss) < 1e-4
    assert no_worker_threads(trainer)


def test_bsp_equivalence_lenet_with_momentum_and_decay(tmp_path):
    """LeNet, Caffe's solver settings, a registered deterministic data set: 2 workers == 1.

    Both sides run their GEMMs with one BLAS thread, as each worker does (the trainer sets it):
    with more, ``kernels.gemm.gemm_auto`` hands LeNet's long-k GEMMs to OpenBLAS instead of v5's
    kernel, whose rounding differs by ~1e-7; LeNet's conv1 bias gradient is a sum of 36,864
    nearly cancelling terms, and four steps of momentum grow that to ~2e-5 (serial against
    serial, one BLAS thread against two), where the two sides here agree to ~3e-8."""
    from minicaffe.solvers import load_solver_param

    nets = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")
    rng = np.random.default_rng(3)
    data.register_dataset("par_mnist", rng.integers(0, 256, (256, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 256))
    try:

        def make():
            param, _ = load_solver_param(os.path.join(nets, "lenet_solver.prototxt"))
            netp = proto.parse_file(os.path.join(nets, "lenet_train_test.prototxt"), "NetParameter")
            for lp in netp.layer:
                if lp.type == "Data":
                    lp.data_param.source = "par_mnist?shuffle=false"
            param.clear("net")
            param.net_param = netp
            for f in ("test_iter", "test_interval"):
                param.clear(f)
            param.display = 0
            param.snapshot = 0
            param.snapshot_after_train = False
            return get_solver(param, log=lambda m: None)

        serial, par = make(), make()
        saved = blas.get_threads()
        blas.set_threads(1)
        try:
            serial.step(4)
        finally:
            blas.set_threads(saved)
        ParallelTrainer(par, 2).step(4)
        assert_params_close(params_of(serial), params_of(par))
    finally:
        data.unregister_dataset("par_mnist")


def test_iter_size_accumulates_global_batches(tmp_path):
    serial = make_solver(tmp_path, iter_size=2)
    serial.step(3)
    par = make_solver(tmp_path, iter_size=2)
    ParallelTrainer(par, 2).step(3)
    assert_params_close(params_of(serial), params_of(par))


def test_ssp_bound_and_progress(tmp_path):
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 2, staleness=2)
    trainer.step(10)
    assert par.iter == 10
    assert np.isfinite(par.smoothed_loss)
    # a worker computing clock c had seen at least the updates of clocks < c - s
    lags = trainer.stats()["staleness"]
    assert sum(lags.values()) == 2 * 10 and max(lags) <= 2, lags
    # and the staleness was used: some clock was computed before the previous update landed
    assert max(lags) >= 1, lags


def test_ssp_zero_is_bsp(tmp_path):
    a, b = make_solver(tmp_path), make_solver(tmp_path)
    ParallelTrainer(a, 2).step(4)
    ParallelTrainer(b, 2, staleness=0).step(4)
    for x, y in zip(params_of(a), params_of(b)):
        np.testing.assert_array_equal(x, y)


def test_replicas_share_one_parameter_vector_and_own_their_gradients(tmp_path):
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 3)
    for rep in trainer.replicas:
        for p, q in zip(rep.learnable_params, par.net.learnable_params):
            assert np.shares_memory(p.data, q.data)  # one copy of the parameters
            assert not np.shares_memory(p.diff, q.diff)
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.shares_memory(trainer.grads[i], trainer.grads[j])
    # every buffer lives in the one arena
    assert all(np.shares_memory(p.data, trainer.arena.buffer) for p in par.net.learnable_params)
    for rep in trainer.replicas:
        assert np.shares_memory(rep.blobs["conv"].data, trainer.arena.buffer)
    s = trainer.memory_summary()
    assert s["planned"] < s["naive"]
    P = sum(p.count for p in par.net.learnable_params) * 4
    assert s["categories"]["params"] == 4 * P  # naive: server net + 3 replicas, each its own


def _record(path):
    import json

    return json.loads(bytes(np.load(path)["record"]).decode())


def test_snapshot_resume_is_exact(tmp_path):
    whole = make_solver(tmp_path)
    ParallelTrainer(whole, 2).step(6)
    first = make_solver(tmp_path, snapshot=3)
    ParallelTrainer(first, 2).step(3)
    state = tmp_path / "snap_iter_3.solverstate"
    second = make_solver(tmp_path)
    second.restore(str(state))
    ParallelTrainer(second, 2).step(3)
    for x, y in zip(params_of(whole), params_of(second)):
        np.testing.assert_array_equal(x, y)


def test_ssp_snapshot_records_the_solvers_data_position(tmp_path):
    """With s > 0 the server fetches batches ahead for the workers; the snapshot must record the
    position of the next batch the *solver* uses, as a one-thread run does."""
    serial = make_solver(tmp_path / "serial", snapshot=3)
    os.makedirs(tmp_path / "serial")
    serial.step(3)
    par = make_solver(tmp_path / "ssp", snapshot=3)
    os.makedirs(tmp_path / "ssp")
    ParallelTrainer(par, 2, staleness=2).step(5)
    want = _record(tmp_path / "serial" / "snap_iter_3.solverstate")["data"]
    got = _record(tmp_path / "ssp" / "snap_iter_3.solverstate")["data"]
    assert got == want and want["train/0/d"]["index"] == 36


def test_serial_training_continues_after_a_parallel_run(tmp_path):
    """The data reader is rewound to the solver's position (batches fetched ahead are not lost)."""
    a = make_solver(tmp_path)
    a.step(4)
    b = make_solver(tmp_path)
    ParallelTrainer(b, 2).step(2)
    b.step(2)
    assert_params_close(params_of(a), params_of(b))
    c = make_solver(tmp_path)
    ParallelTrainer(c, 2, staleness=3).step(2)  # fetched 3 batches ahead
    assert c.net.layers[0].state_dict()["index"] == 2 * 12


def test_worker_error_stops_the_run_and_keeps_the_last_snapshot(tmp_path):
    par = make_solver(tmp_path, snapshot=2, max_iter=10)
    trainer = ParallelTrainer(par, 2)
    layer = trainer.replicas[1].layer_dict["ip"]
    forward, calls = layer.forward, []

    def failing(bottom, top):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("disk on fire")
        forward(bottom, top)

    layer.forward = failing
    with pytest.raises(WorkerError) as info:
        trainer.solve()
    err = info.value
    assert err.worker == 1 and err.iteration == 3
    assert "worker 1" in str(err) and "disk on fire" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
    assert no_worker_threads(trainer)  # an error ends the threads at once, not at close()
    assert sorted(os.listdir(tmp_path)) == ["snap_iter_2.caffemodel", "snap_iter_2.solverstate"]
    fresh = make_solver(tmp_path)
    fresh.restore(str(tmp_path / "snap_iter_2.solverstate"))
    assert fresh.iter == 2


def test_ctrl_c_stops_all_threads_and_snapshots(tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    par = make_solver(tmp_path, max_iter=50, snapshot_after_train=True)
    par.on_iteration.append(lambda s, loss, lr: os.kill(os.getpid(), signal.SIGINT) if s.iter == 3 else None)
    # (a process started in the background inherits SIGINT ignored: set the handler a terminal has)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trainer = train_with_workers(par, 2)
        restored = signal.getsignal(signal.SIGINT)  # the runtime puts back the handler it found
    finally:
        signal.signal(signal.SIGINT, previous)
    assert par.requested_stop and 3 <= par.iter < 50
    assert (tmp_path / f"snap_iter_{par.iter}.solverstate").exists()
    assert no_worker_threads(trainer)
    assert restored is signal.default_int_handler


def test_blas_threads_are_limited_while_training_and_restored(tmp_path):
    before = blas.get_threads()
    if before is None:
        pytest.skip("no OpenBLAS found in this process")
    par = make_solver(tmp_path)
    seen = []
    par.on_iteration.append(lambda s, loss, lr: seen.append(blas.get_threads()))
    ParallelTrainer(par, 2).step(2)
    assert seen == [max(1, blas.cores() // 2)] * 2
    assert blas.get_threads() == before


def test_errors_users_hit(tmp_path):
    with pytest.raises(caffe.SolverError, match="at least 1"):
        ParallelTrainer(make_solver(tmp_path), 0)
    with pytest.raises(caffe.SolverError, match="batch of at least 5"):
        ParallelTrainer(make_solver(tmp_path, batch=4), 5)
    with pytest.raises(caffe.SolverError, match="staleness"):
        ParallelTrainer(make_solver(tmp_path), 2, staleness=-1)


def test_memory_report_of_a_parallel_run(tmp_path):
    trainer = ParallelTrainer(make_solver(tmp_path), 2)
    text = report_text(trainer.plans, title="small x2")
    assert "worker 0" in text and "server net" in text
