"""The threaded parameter-server runtime (minicaffe/parallel) on a GPU backend: its arena, the
flat parameter and gradient vectors and the workers' gradient slots are device memory there, and
BSP with two workers still equals one thread on the whole batch."""

import numpy as np
import pytest

from minicaffe import backend as _backend
from minicaffe import data, proto
from minicaffe.parallel import ParallelTrainer
from minicaffe.solvers import get_solver

NET = """
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "gpu_par_set?shuffle=false" batch_size: 4 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def dataset():
    rng = np.random.default_rng(3)
    data.register_dataset("gpu_par_set", rng.integers(0, 256, (16, 1, 5, 5), dtype=np.uint8), rng.integers(0, 3, 16))
    yield
    data.unregister_dataset("gpu_par_set")


def make_solver(be):
    param = proto.Message(
        "SolverParameter", base_lr=0.05, momentum=0.9, weight_decay=0.001, lr_policy="fixed", random_seed=5, display=0
    )
    param.net_param = proto.parse(NET, "NetParameter")
    param.snapshot_after_train = False
    return get_solver(param, log=lambda m: None, backend=be)


def test_two_workers_on_cudasim_equal_one_cpu_thread(dataset):
    reason = _backend.why_not("cudasim")
    if reason is not None:
        pytest.skip(f"cudasim: {reason}")
    gpu = _backend.get("cudasim")
    serial = make_solver(_backend.get("cpu"))
    serial.step(2)
    par = make_solver(gpu)
    trainer = ParallelTrainer(par, 2)
    assert isinstance(trainer.W, gpu.xp.ndarray) and isinstance(trainer.grads, gpu.xp.ndarray)
    trainer.step(2)
    assert par.iter == 2
    for i, (a, b) in enumerate(zip(serial.net.learnable_params, par.net.learnable_params)):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-4, atol=1e-5, err_msg=f"parameter {i}")
    assert abs(serial.smoothed_loss - par.smoothed_loss) < 1e-4
