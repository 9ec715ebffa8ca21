"""The worker threads' lifetime: started by a trainer's first run, parked between runs (a
``step(1)`` loop starts and joins no thread), ended by ``close()`` / the context manager / garbage
collection / interpreter exit, and at once after an error or an interrupt; no thread outlives its
trainer's ``close()`` and none is left running after an error."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from minicaffe.errors import SolverError
from minicaffe.parallel import ParallelTrainer, WorkerError
from tests.test_parallel import assert_params_close, dataset, make_solver, params_of  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_until_ended(threads, seconds=10.0):
    deadline = time.monotonic() + seconds
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [t.name for t in threads if t.is_alive()]


def test_threads_park_between_steps_and_end_at_close(tmp_path):
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 2)
    assert trainer.worker_threads() == []  # nothing starts before the first run
    trainer.step(1)
    threads = trainer.worker_threads()
    assert len(threads) == 1 and all(t.daemon for t in threads)  # worker 1 (worker 0: this thread)
    before = threading.active_count()
    for _ in range(8):
        trainer.step(1)
        assert trainer.worker_threads() == threads  # the same threads, parked between runs
    assert threading.active_count() == before
    assert par.iter == 9
    trainer.close()
    assert not [t.name for t in threads if t.is_alive()]  # close() joined them
    assert trainer.stats()["clocks"] == 1  # the last run's figures stay readable
    trainer.close()  # idempotent
    with pytest.raises(SolverError, match="was closed"):
        trainer.step(1)


def test_step_one_in_a_loop_trains_as_one_run(tmp_path):
    """Parked threads carry nothing from one run into the next: 6 x step(1) == step(6) ==
    6 serial iterations; the same for SSP (whose runs each end with every batch used)."""
    serial = make_solver(tmp_path)
    serial.step(6)
    for staleness in (0, 1):
        whole, pieces = make_solver(tmp_path), make_solver(tmp_path)
        with ParallelTrainer(whole, 2, staleness=staleness) as a, ParallelTrainer(pieces, 2, staleness=staleness) as b:
            a.step(6)
            for _ in range(6):
                b.step(1)
        if staleness == 0:
            for x, y in zip(params_of(whole), params_of(pieces)):
                np.testing.assert_array_equal(x, y)
            assert_params_close(params_of(serial), params_of(pieces))
        assert pieces.iter == 6 and np.isfinite(pieces.smoothed_loss)
        assert pieces.net.layers[0].state_dict()["index"] == 6 * 12  # no batch read ahead and lost


def test_the_context_manager_closes(tmp_path):
    with ParallelTrainer(make_solver(tmp_path), 3) as trainer:
        trainer.step(2)
        threads = trainer.worker_threads()
        assert [t.name for t in threads] == ["minicaffe-worker-1", "minicaffe-worker-2"]
    assert not [t.name for t in threads if t.is_alive()]


def test_a_garbage_collected_trainer_ends_its_parked_threads(tmp_path):
    def run():
        trainer = ParallelTrainer(make_solver(tmp_path), 2)
        trainer.step(2)
        return trainer.worker_threads()  # Thread objects: they do not keep the trainer alive

    threads = run()
    assert len(threads) == 1
    gc.collect()
    assert wait_until_ended(threads) == []


@pytest.mark.parametrize("k", [0, 1])  # worker 0 in the server's own thread, worker 1 a thread
def test_an_error_ends_every_worker_thread_at_once_and_a_new_run_starts_fresh_ones(tmp_path, k):
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 3)
    trainer.step(2)
    first = trainer.worker_threads()
    layer = trainer.replicas[k].layer_dict["ip"]
    forward, calls = layer.forward, []

    def failing(bottom, top):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("bad sector")
        forward(bottom, top)

    layer.forward = failing
    with pytest.raises(WorkerError, match=f"worker {k} failed at iteration 3: RuntimeError: bad sector"):
        trainer.step(5)
    assert trainer.worker_threads() == []  # joined before the error reached us, not at close()
    assert not [t.name for t in first if t.is_alive()]
    layer.forward = forward
    trainer.step(2)  # a new run starts new threads
    assert len(trainer.worker_threads()) == 2 and not set(trainer.worker_threads()) & set(first)
    trainer.close()


def test_an_interrupt_in_the_server_ends_every_worker_thread(tmp_path):
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 2)

    def interrupt(solver, loss, lr):
        if solver.iter == 3:
            raise KeyboardInterrupt

    par.on_iteration.append(interrupt)
    with pytest.raises(KeyboardInterrupt):
        trainer.step(10)
    assert trainer.worker_threads() == []
    par.on_iteration.remove(interrupt)
    trainer.close()


def test_a_stop_request_with_batches_read_ahead_joins_the_workers(tmp_path):
    """A run that ends early (the stop flag) may leave a worker computing a batch fetched
    ahead: its threads are joined, the reader rewound, and the next run trains on."""
    par = make_solver(tmp_path)
    trainer = ParallelTrainer(par, 2, staleness=2)

    def stop(solver, loss, lr):
        if solver.iter == 2:
            solver.requested_stop = True

    par.on_iteration.append(stop)
    trainer.step(10)
    assert par.iter == 2 and trainer.worker_threads() == []
    assert par.net.layers[0].state_dict()["index"] == 2 * 12
    par.on_iteration.remove(stop)
    par.requested_stop = False
    trainer.step(2)
    assert par.iter == 4 and len(trainer.worker_threads()) == 2
    trainer.close()


LEAK = textwrap.dedent(
    """
    import gc, sys, threading
    import numpy as np
    from minicaffe import data
    from minicaffe.parallel import ParallelTrainer
    from tests.test_parallel import make_solver
    import pathlib, tempfile

    rng = np.random.default_rng(11)
    data.register_dataset("par_set", rng.integers(0, 256, size=(96, 1, 8, 8), dtype=np.uint8), rng.integers(0, 5, size=96))
    tmp = pathlib.Path(tempfile.mkdtemp())
    base = threading.active_count()
    for i in range(12):  # trainers dropped without close(): their threads must not pile up
        trainer = ParallelTrainer(make_solver(tmp), 2)
        trainer.step(1)
        trainer = None
        gc.collect()
    workers = lambda: [t for t in threading.enumerate() if t.name.startswith("minicaffe-worker")]
    for _ in range(500):
        if not workers():
            break
        threading.Event().wait(0.01)
    print("WORKERS", len(workers()), flush=True)
    keep = ParallelTrainer(make_solver(tmp), 2)
    keep.step(1)  # parked threads while the interpreter exits
    print("EXITING", len(workers()), flush=True)
    """
)


def test_dropped_trainers_leak_no_thread_and_the_interpreter_exits_cleanly():
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", LEAK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WORKERS 0" in proc.stdout, proc.stdout
    assert "EXITING 1" in proc.stdout, proc.stdout  # worker 1 (worker 0 is the main thread)
    assert "Fatal Python error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


class _Affinity:
    """A solver callback: the cores of the thread that runs each iteration's on_start."""

    def __init__(self):
        self.seen = []

    def on_start(self, solver):
        self.seen.append(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="thread affinity is Linux's")
def test_the_calling_thread_computes_worker_0_on_its_core_and_gets_its_cores_back(tmp_path):
    """Under BSP the thread that calls step() is worker 0 (bound, with pin, to worker 0's core
    while the run lasts, its own cores given back after), so only N-1 threads start; with
    server_computes=False, or SSP, every worker is a thread and the caller is left alone."""
    par = make_solver(tmp_path)
    probe = _Affinity()
    par.add_callback(probe)
    before = os.sched_getaffinity(0)
    first = min(before)
    with ParallelTrainer(par, 2, pin=True) as trainer:
        trainer.step(3)
        assert probe.seen == [{first}] * 3 and os.sched_getaffinity(0) == before
        assert [t.name for t in trainer.worker_threads()] == ["minicaffe-worker-1"]
        assert trainer.stats()["worker_compute"][0] > 0  # computed here, not in a thread
    for kwargs in ({"server_computes": False}, {"staleness": 1}):
        probe.seen.clear()
        with ParallelTrainer(par, 2, pin=True, **kwargs) as trainer:
            trainer.step(2)
            assert probe.seen == [before] * 2
            assert [t.name for t in trainer.worker_threads()] == ["minicaffe-worker-0", "minicaffe-worker-1"]


def test_a_nan_in_the_callers_own_shard_names_worker_0_and_nothing_is_updated(tmp_path):
    """Worker 0's shard (computed by the server's own thread) makes the loss NaN: the server
    reports it at once (it does not wait for an update that will never come), names worker 0
    and its images, and the parameters are those before that iteration."""
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, size=(96, 1, 8, 8)).astype(np.float32)
    images[13] = np.nan  # batch 1 holds images 12..23: worker 0's rows 0..5
    from minicaffe import data

    data.unregister_dataset("par_set")
    data.register_dataset("par_set", images, rng.integers(0, 5, size=96))
    par = make_solver(tmp_path)
    with ParallelTrainer(par, 2) as trainer:
        trainer.step(1)
        after_one = params_of(par)
        t0 = time.perf_counter()
        with pytest.raises(
            SolverError, match=r"loss is nan at iteration 1, from worker 0 \(images 0\.\.5 of the batch\)"
        ):
            trainer.step(1)
        assert time.perf_counter() - t0 < 5
        assert trainer.worker_threads() == []
    for x, y in zip(after_one, params_of(par)):
        np.testing.assert_array_equal(x, y)
