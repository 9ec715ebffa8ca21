"""benchmarks/parallel_floor.py's machinery: the pair of forked processes and the neighbour on
core 1 (the LeNet rows themselves are a benchmark, run by hand)."""

import multiprocessing
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import parallel_floor as floor  # noqa: E402

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the floor binds one worker to each of cores 0 and 1"
)


class Counting:
    """Stands in for a net: forward_backward counts its calls in shared memory."""

    def __init__(self, calls):
        self.calls = calls
        self.x = np.ones(4096, np.float32)

    def forward_backward(self):
        self.x *= 1.0001
        with self.calls.get_lock():
            self.calls.value += 1


@pytest.mark.parametrize("in_step", [False, True])
def test_two_processes_each_run_warmup_and_steps_and_report_their_times(in_step):
    ctx = multiprocessing.get_context("fork")
    calls = [ctx.Value("i", 0), ctx.Value("i", 0)]
    wall, cpu = floor.two_processes([Counting(c) for c in calls], steps=7, warmup=3, in_step=in_step)
    assert [c.value for c in calls] == [10, 10]  # 3 warm-up + 7 timed steps, in each process
    assert wall > 0 and len(cpu) == 2 and all(c >= 0 for c in cpu)
    assert not multiprocessing.active_children()


def test_a_failing_process_of_the_pair_is_reported():
    class Failing:
        def forward_backward(self):
            os._exit(3)

    ctx = multiprocessing.get_context("fork")
    with pytest.raises(SystemExit, match="exited with code 3"):
        floor.two_processes([Counting(ctx.Value("i", 0)), Failing()], steps=2, warmup=0, in_step=False, timeout=5)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("kind", ["fma", "sgemm", "stream"])
def test_next_to_runs_the_step_on_core_0_while_the_neighbour_loops_and_stops_it(kind):
    calls = multiprocessing.get_context("fork").Value("i", 0)
    cores = os.sched_getaffinity(0)
    try:
        wall, cpu = floor.next_to(Counting(calls), 5, kind, stream_mb=1.0)
        assert os.sched_getaffinity(0) == {0}
    finally:
        os.sched_setaffinity(0, cores)
    assert calls.value == 5 and wall > 0 and cpu >= 0
    assert not multiprocessing.active_children()  # the neighbour was stopped and joined


def _lenet_solver(batch):
    """LeNet's solver on one synthetic batch read again and again (every batch the same rows),
    a fixed rate: a BSP step is then a function of W and the history alone."""
    from minicaffe.parallel import synthetic_solver

    solver_file = os.path.join(ROOT, "nets", "lenet_solver.prototxt")
    return synthetic_solver(solver_file, batch, count=batch, shuffle=False, lr_policy="fixed", random_seed=1)


def test_bsp_processes_compute_the_threaded_runtimes_update():
    """The two processes' BSP clocks (shared W, gradients and history; shard.py's update) give
    the weights the threaded runtime gives: the benchmark's row times real training steps."""
    from minicaffe.parallel import ParallelTrainer, blas, lanes

    lanes_before, blas_before = lanes.set_count(1), blas.get_threads()  # (a forked child has no helper threads)
    blas.set_threads(1)
    try:
        with ParallelTrainer(_lenet_solver(8), 2, log=lambda m: None) as ref:
            ref.step(5)
        solver = _lenet_solver(8)
        with ParallelTrainer(solver, 2, log=lambda m: None) as trainer:
            trainer.step(2)
        result = {}
        wall, cpu = floor.bsp_processes(trainer, solver, steps=3, warmup=0, timeout=120, result=result)
    finally:
        lanes.set_count(lanes_before)
        if blas_before:
            blas.set_threads(blas_before)
    assert wall > 0 and len(cpu) == 2
    assert not np.array_equal(result["W"], trainer.W)  # three updates were applied
    np.testing.assert_allclose(result["W"], ref.W, rtol=1e-6, atol=1e-7)  # clocks 3..5, as the runtime ran them
    assert not multiprocessing.active_children()


def test_synthetic_solver_reads_synthetic_batches_of_the_size_asked():
    from minicaffe.parallel import synthetic_solver

    a, b = (
        synthetic_solver(os.path.join(ROOT, "nets", "lenet_solver.prototxt"), 6, random_seed=3, base_lr=0.5)
        for _ in range(2)
    )
    assert a.net.blobs["data"].shape == (6, 1, 28, 28) and a.param.base_lr == 0.5
    assert a.param.display == 0 and not a.param.has("test_interval") and not a.test_nets  # no tests
    assert a.net.layers[0].param.data_param.source.startswith("synthetic:1x28x28:10:1024:")
    test_data = [lp for lp in a.param.net_param.layer if lp.type == "Data" and lp.include[0].phase == "TEST"]
    assert [lp.data_param.batch_size for lp in test_data] == [100]  # the test phase's batch is left as it was
    for x, y in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(x.data, y.data)  # the same seed: the same start
