"""python -m minicaffe.time's floors: the SGEMM ceiling is the higher of a measurement before and
one after the timed iterations, so one measurement in a busy moment cannot lower every floor (and
raise every percentage); a spread between the two is reported."""

import pytest

from minicaffe import Net
from minicaffe.parallel import blas
from minicaffe.tools import timing

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 1 dim: 8 dim: 8 } shape { dim: 8 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("floors") / "tiny.prototxt"
    path.write_text(NET)
    return Net(str(path), "TRAIN")


def test_floors_take_the_higher_ceiling_and_warn_on_a_spread(net):
    """An earlier rate far above this machine's (as if the later measurement had met a busy
    moment): the floors use it, and the line names both rates and warns."""
    threads = blas.get_threads()
    fl, line = timing.floors(net, 1, earlier=1e6)
    assert blas.get_threads() == threads  # the measurement put BLAS back
    kind, f, b = timing.layer_work(net, 1)
    cores = min(blas.cores(), blas.get_threads() or 1)
    assert kind == "flop" and fl[1] == pytest.approx((f / (1e6 * 1e9 * cores), b / (1e6 * 1e9 * cores)))
    assert "GEMM layers at 1000000.0 GFLOP/s" in line and "the higher of 1000000.0 before and" in line
    assert "\nWarning: the SGEMM rate measured" in line and "the machine was busy" in line


def test_floors_without_an_earlier_rate_measure_once(net):
    fl, line = timing.floors(net, 1)
    assert fl[0] is None and fl[1][0] > 0  # the data layer has no floor
    assert "the higher of" not in line and "Warning" not in line  # one measurement: no spread
