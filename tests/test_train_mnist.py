"""Real MNIST, real LeNet, Caffe's solver: a short convergence check (slow: fetches MNIST once).

A broken gradient (wrong sign, wrong layer, a missing term) cannot reach 95% test accuracy in 300
iterations; Caffe's LeNet is at ~97% there.
"""

import os

import pytest

import minicaffe as caffe

NETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")


@pytest.mark.slow
def test_lenet_reaches_95_percent_in_300_iterations():
    caffe.set_mode_cpu()
    solver = caffe.get_solver(os.path.join(NETS, "lenet_solver.prototxt"), log=lambda m: None)
    solver.param.test_interval = 0
    solver.param.snapshot = 0
    solver.param.test_iter[0] = 20  # 2,000 test images
    solver.step(300)
    result = solver.test(0)
    assert result["accuracy"] >= 0.95, result
    assert result["loss"] < 0.2, result
