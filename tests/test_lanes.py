"""Lanes (minicaffe/parallel/lanes.py): one layer call split across threads gives the one-lane
result (within the order of floating-point sums), really runs the lanes at once, and reports a
lane's error; the time tool sets each layer against its floor."""

import threading

import numpy as np
import pytest
from layer_util import blob, make_layer, setup

import minicaffe.layers.convolution as conv_mod
from minicaffe.parallel import blas, lanes
from minicaffe.tools import timing


@pytest.fixture
def restore_lanes():
    saved = lanes.count()
    yield
    lanes.set_count(saved)


def test_run_runs_the_lanes_at_once_and_reraises(restore_lanes):
    # Each task waits for the other at a barrier: one after the other would time out.
    barrier = threading.Barrier(3, timeout=10)
    names = []
    lanes.run([lambda: names.append(barrier.wait() is not None)] * 3)
    assert names == [True] * 3

    def boom():
        raise ValueError("lane 2 failed")

    done = []
    with pytest.raises(ValueError, match="lane 2 failed"):
        lanes.run([lambda: done.append(0), lambda: done.append(1), boom])
    assert sorted(done) == [0, 1]  # the others finished before the error was raised
    lanes.run([lambda: done.append(2), lambda: done.append(3)])  # the helpers survive an error
    assert sorted(done) == [0, 1, 2, 3]


def test_a_threads_lane_helpers_end_with_it():
    """Every calling thread gets helpers of its own (a SingleCaffe worker using lanes); when
    that thread ends, its helpers end too, so closing a trainer leaves no lane thread behind."""
    import time

    def lane_threads():
        return {t for t in threading.enumerate() if t.name == "minicaffe-lane"}

    before = lane_threads()
    seen = []

    def worker():
        lanes.run([lambda: None, lambda: None, lambda: None])  # two helpers for this thread
        seen.append(lane_threads() - before)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(seen[0]) == 2, "the worker's lanes ran on two helpers of its own"
    deadline = time.monotonic() + 10
    while seen[0] & lane_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not seen[0] & lane_threads(), "a lane helper outlived the thread that started it"
    assert before <= lane_threads(), "another thread's helpers were ended"


def test_split_covers_the_range():
    assert lanes.split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert lanes.split(2, 4) == [(0, 1), (1, 2)]
    assert lanes.split(0, 2) == [(0, 0)]
    with pytest.raises(ValueError, match="lanes must be >= 1"):
        lanes.set_count(0)


CONV = (
    'type: "Convolution" convolution_param {{ num_output: {m} kernel_size: 3 pad: 1 stride: {s} group: {g} '
    'weight_filler {{ type: "gaussian" std: 0.5 }} bias_filler {{ type: "uniform" min: -1 max: 1 }} }}'
)


def _run_layer(text, arrays, n_lanes, dtype=np.float64, seed=7, n_tops=None):
    """Forward and backward of a fresh layer (same seeded weights) at ``n_lanes``: tops, bottom
    diffs, parameter diffs (accumulated over two backward calls: the lanes' partial sums add)."""
    from minicaffe import backend as _backend
    from minicaffe.rng import set_random_seed

    be = _backend.get("cpu")
    set_random_seed(seed)
    layer = make_layer(text, be, dtype=dtype)
    bottoms = [blob(be, a, dtype) for a in arrays]
    tops = setup(layer, bottoms, n_tops or len(arrays), dtype)
    lanes.set_count(n_lanes)
    layer.forward(bottoms, tops)
    g = np.random.default_rng(seed)
    for t in tops:
        t.diff[...] = g.standard_normal(t.shape)
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(tops, [True] * len(bottoms), bottoms)
    layer.backward(tops, [True] * len(bottoms), bottoms)
    return [t.data.copy() for t in tops] + [b.diff.copy() for b in bottoms] + [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("n_lanes", [2, 3])
@pytest.mark.parametrize("chunked", [False, True])
def test_convolution_in_lanes_equals_one_lane(restore_lanes, monkeypatch, n_lanes, chunked):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((7, 4, 6, 5)), rng.standard_normal((7, 4, 6, 5))]  # two bottoms, 7 images
    if chunked:  # columns of 2 images per lane at most: several rounds of lanes
        monkeypatch.setattr(conv_mod, "COL_LIMIT", 2 * 4 * 9 * 30 * n_lanes)
    text = CONV.format(m=6, s=1, g=2)
    ref = _run_layer(text, xs, 1)
    got = _run_layer(text, xs, n_lanes)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_lanes", [1, 2, 3])
def test_direct_convolution_equals_im2col_gemm(restore_lanes, monkeypatch, n_lanes):
    """Few input taps (4 x 3 x 3 at stride 1, LeNet's conv1 has 25): the CPU backend's direct
    kernels run forward and the parameter gradients, in every lane; the same layer through
    im2col + GEMM (the direct kernels switched off) gives the same tops and diffs."""
    from minicaffe.backend import cpu

    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((7, 4, 6, 5))]
    text = CONV.format(m=6, s=1, g=1)
    got = _run_layer(text, xs, n_lanes)
    monkeypatch.setattr(cpu, "DIRECT_MAX_TAPS", 0)
    ref = _run_layer(text, xs, 1)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_direct_convolution_keeps_no_columns(monkeypatch):
    """The direct path allocates no column or GEMM buffer (LeNet's conv1 kept 6.6 MB of them)."""
    from minicaffe import backend as _backend
    from minicaffe.backend import cpu

    x = np.random.default_rng(8).standard_normal((3, 4, 6, 5))
    names, direct = {}, cpu.DIRECT_MAX_TAPS
    for taps in (direct, 0):
        monkeypatch.setattr(cpu, "DIRECT_MAX_TAPS", taps)
        layer = make_layer(CONV.format(m=6, s=1, g=1), _backend.get("cpu"))
        bottoms = [blob(layer.backend, x)]
        tops = setup(layer, bottoms)
        layer.forward(bottoms, tops)
        names[taps] = sorted(s.name for s in layer.scratch())
    assert names[0] == ["col", "out"]
    assert names[direct] == []


def test_convolution_one_image_per_lane_pointwise(restore_lanes):
    """1x1 kernels with one image per lane take the no-column path in every lane."""
    text = (
        'type: "Convolution" convolution_param { num_output: 3 kernel_size: 1 '
        'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }'
    )
    x = np.random.default_rng(4).standard_normal((2, 5, 3, 4))
    for r, g in zip(_run_layer(text, [x], 1), _run_layer(text, [x], 2)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "text, shape",
    [
        ('type: "InnerProduct" inner_product_param { num_output: 70 weight_filler { type: "gaussian" } }', (40, 900)),
        ('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', (9, 8, 64, 64)),
        ('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }', (9, 8, 64, 64)),
    ],
    ids=["inner_product", "max_pool", "ave_pool"],
)
def test_split_layers_in_lanes_equal_one_lane(restore_lanes, text, shape):
    """Big enough to be split (lanes.MIN_FLOPS, MIN_ELEMENTS), with an odd number of rows."""
    x = np.random.default_rng(5).standard_normal(shape)
    for r, g in zip(_run_layer(text, [x], 1), _run_layer(text, [x], 2)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_solver_steps_in_lanes_match_one_lane(restore_lanes):
    """LeNet's layers on synthetic data, float32: 3 SGD steps with 2 lanes end within float32's
    rounding of the one-lane run (only the order of the weight-gradient sums differs)."""
    import minicaffe as caffe
    from minicaffe import proto
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.solvers import get_solver, load_solver_param

    def losses(n_lanes):
        lanes.set_count(n_lanes)
        caffe.set_random_seed(1)
        param, base = load_solver_param("nets/lenet_solver.prototxt")
        netp = proto.parse_file("nets/lenet_train_test.prototxt", "NetParameter")
        param.clear("net")
        param.net_param = with_synthetic_data(netp, count=256)
        for f in ("test_iter", "test_interval"):
            param.clear(f)
        param.display = param.snapshot = 0
        param.snapshot_after_train = False
        s = get_solver(param, log=lambda m: None)
        out = []
        for _ in range(3):
            s.step(1)
            out.append(float(s.net.blobs["loss"].data))
        return np.array(out), s.net.params["conv2"][0].data.copy()

    (l1, w1), (l2, w2) = losses(1), losses(2)
    np.testing.assert_allclose(l2, l1, rtol=1e-4)
    np.testing.assert_allclose(w2, w1, rtol=1e-3, atol=1e-5)


def test_time_tool_sets_each_layer_against_its_floor(restore_lanes, tmp_path, capsys):
    net = tmp_path / "net.prototxt"
    net.write_text(
        'name: "t" layer { name: "d" type: "DummyData" top: "x" top: "y" dummy_data_param { '
        "shape { dim: 8 dim: 3 dim: 12 dim: 12 } shape { dim: 8 } } }\n"
        'layer { name: "conv" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 8 '
        'kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }\n'
        'layer { name: "pool" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: MAX kernel_size: 2 '
        "stride: 2 } }\n"
        'layer { name: "relu" type: "ReLU" bottom: "p" top: "p" }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "p" top: "z" inner_product_param { num_output: 4 '
        'weight_filler { type: "gaussian" std: 0.1 } } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }\n'
    )
    threads = blas.get_threads()
    assert timing.main([str(net), "--iterations", "3", "--warmup", "1", "--lanes", "2"]) == 0
    text = capsys.readouterr().out
    assert lanes.count() == 1 and blas.get_threads() == threads  # the tool restored both
    assert "2 lane(s)" in text and "Floors: GEMM layers at" in text
    rows = {line.split()[1]: line for line in text.splitlines() if "forward:" in line}
    assert "% roof:   -" in rows["d"]  # a data layer has no floor
    for name in ("conv", "pool", "relu", "ip", "loss"):
        pct = int(rows[name].split("% roof:")[1])
        assert 0 <= pct <= 100, rows[name]  # a layer faster than its floor: a wrong floor

    # the floors' arithmetic on this net: conv 2*M*K per output value, backward twice that
    # with the bottom diff not needed here (the data layer's top), so once
    tnet = __import__("minicaffe").Net(str(net), "TRAIN")
    kind, f, b = timing.layer_work(tnet, 1)
    assert kind == "flop" and f == 2.0 * (8 * 8 * 10 * 10) * (3 * 9) and b == f
    kind, f, b = timing.layer_work(tnet, 2)
    assert kind == "byte" and f == 4 * (8 * 8 * 10 * 10 + 8 * 8 * 5 * 5)
