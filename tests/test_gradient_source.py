"""A gradient source that overwrites the diffs (``Solver.set_gradient_source(fn, overwrites=True)``):
the Solver's loop does not clear them before it, refuses it with iter_size > 1, and the threaded
runtime (whose every clock writes all of G) trains exactly as before while the server no longer
zeroes the gradient each step."""

import numpy as np
import pytest

from minicaffe.errors import SolverError
from minicaffe.parallel import ParallelTrainer
from tests.test_parallel import assert_params_close, dataset, make_solver, params_of  # noqa: F401


class DiffsAtStart:
    """A solver callback recording every learnable diff as ``on_start`` finds it."""

    def __init__(self):
        self.seen = []

    def on_start(self, solver):
        self.seen.append([p.diff.copy() for p in solver.net.learnable_params])


def test_a_source_that_adds_has_the_diffs_cleared_before_it(tmp_path):
    s = make_solver(tmp_path)
    watch = DiffsAtStart()
    s.add_callback(watch)
    s.set_gradient_source(s.net.forward_backward)  # adds (the default contract)
    s.step(3)
    assert all(not d.any() for seen in watch.seen for d in seen)


def test_a_source_that_overwrites_is_not_preceded_by_a_clear(tmp_path):
    s, ref = make_solver(tmp_path), make_solver(tmp_path)
    watch = DiffsAtStart()
    s.add_callback(watch)

    def source():  # writes every diff: the net's gradients of a batch, computed from zeros
        s.net.clear_param_diffs()
        return s.net.forward_backward()

    s.set_gradient_source(source, overwrites=True)
    s.step(3)
    ref.step(3)
    for x, y in zip(params_of(s), params_of(ref)):  # the same steps
        np.testing.assert_array_equal(x, y)
    # iteration 0 finds the diffs the solver was built with (zeros); later ones, the previous
    # iteration's update values (SGD leaves them in the diffs), not zeros
    assert all(not d.any() for d in watch.seen[0])
    assert all(any(d.any() for d in seen) for seen in watch.seen[1:])
    s.param.iter_size = 2
    with pytest.raises(SolverError, match="iter_size 2: the gradient source overwrites"):
        s.step(1)
    s.set_gradient_source(None)  # the default source adds again, after a clear
    s.step(1)
    assert s.iter == 4


@pytest.mark.parametrize("shard", [True, False])
def test_the_trainer_writes_the_gradient_instead_of_having_it_cleared(tmp_path, shard):
    """The server's Solver no longer zeroes the 1.7 MB LeNet gradient each step: the sharded update
    (or the server's reduce) writes all of it; results are those of one thread, and the diffs
    after a run are the ones the server's update leaves."""
    serial = make_solver(tmp_path)
    serial.step(5)
    par = make_solver(tmp_path)
    watch = DiffsAtStart()
    par.add_callback(watch)
    with ParallelTrainer(par, 2, shard_update=shard) as trainer:
        trainer.step(2)
        trainer.step(3)
    assert trainer.sharded is shard
    assert_params_close(params_of(serial), params_of(par))
    assert len(watch.seen) == 5 and all(any(d.any() for d in seen) for seen in watch.seen[1:])
    assert_params_close(
        [p.diff for p in serial.net.learnable_params], [p.diff for p in par.net.learnable_params], rtol=1e-4, atol=1e-6
    )


def test_the_trainer_still_has_iter_size_batches_cleared_and_added(tmp_path):
    serial = make_solver(tmp_path, iter_size=2)
    serial.step(3)
    par = make_solver(tmp_path, iter_size=2)
    watch = DiffsAtStart()
    par.add_callback(watch)
    ParallelTrainer(par, 2).step(3)
    assert all(not d.any() for seen in watch.seen for d in seen)
    assert_params_close(params_of(serial), params_of(par))
