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
