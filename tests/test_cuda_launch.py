"""Launch overhead, proven in the simulator: launch configurations computed once per shape, the
engine's kernels compiled ahead for their explicit signatures (no launch in a step compiles),
the fused kernels against numpy, the launches of a LeNet training step counted, and a step that
never waits for the host -- checked by capture mode, which makes any host round trip raise.

These run on ``cudasim`` (the ``cuda`` cases, marked gpu, in a process started with
NUMBA_ENABLE_CUDASIM=0 on a GPU machine).
"""

import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import backend as _backend
from minicaffe.errors import LayerError, SolverError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=["cudasim", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request):
    reason = _backend.why_not(request.param)
    if reason is not None:
        pytest.skip(f"{request.param}: {reason}")
    return _backend.get(request.param)


@pytest.fixture
def L(gpu):
    from kernels.cuda import _launch

    return _launch.launcher()


def lenet_train_text(batch):
    """nets/lenet.prototxt at ``batch`` with labels and SoftmaxWithLoss -- LeNet's layers and
    launches -- at reduced widths (16x16 images, 2 and 3 conv filters, 8 hidden units): the
    simulator runs every CUDA thread in Python, and the launch counts do not depend on sizes."""
    with open(os.path.join(ROOT, "nets", "lenet.prototxt")) as f:
        text = f.read().replace("dim: 64", f"dim: {batch}").replace("dim: 28", "dim: 16")
    for wide, narrow in (("num_output: 20", "num_output: 2"), ("num_output: 50", "num_output: 3")):
        text = text.replace(wide, narrow)
    text = text.replace("num_output: 500", "num_output: 8")
    head, _, _ = text.rpartition('layer { name: "prob"')
    return head + (
        f'layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {batch} }} }} }}\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }\n'
    )


# -- launch configurations, once per shape --------------------------------------------------------------
def test_launch_configuration_is_computed_once_per_kernel_and_shape(gpu, L):
    x = gpu.from_host(np.linspace(-1, 1, 37, dtype=np.float32))
    y = gpu.xp.zeros(37, dtype=np.float32)
    gpu.relu_fwd(x, 0.0, y)  # the shape may have been seen by an earlier test: count from here
    misses = L.config_misses
    table = L.config_table()
    assert ("_relu_fwd_v2", 37) in table
    gpu.relu_fwd(x, 0.5, y)
    gpu.relu_fwd(y, 0.0, y)
    assert L.config_misses == misses  # the second and third launches computed nothing
    z = gpu.xp.zeros(38, dtype=np.float32)
    gpu.relu_fwd(z, 0.0, z)
    assert L.config_misses == misses + 1 and ("_relu_fwd_v2", 38) in L.config_table()
    grid, block = L.config_table()[("_relu_fwd_v2", 37)]
    assert block == L.config.threads and grid == L.blocks(37)


# -- eager compilation -----------------------------------------------------------------------------------
def test_a_net_compiles_its_kernels_when_built_and_its_step_compiles_nothing(gpu, L):
    """Building a net on a GPU backend compiles every engine kernel for its dtype from the
    explicit signatures (kernels/cuda/_signatures.py); a LeNet training step then launches only
    kernels with a signature compiled before it (in the simulator, which compiles nothing, the
    launch types are checked against the list: ``lazy_compiles`` stays put)."""
    from kernels.cuda._signatures import signatures

    net = caffe.Net(lenet_train_text(2), caffe.TRAIN, backend=gpu)
    for kernel, sig in signatures(L, np.float32):
        assert tuple(sig) in L.compiled.get(_name(kernel), ()), _name(kernel)
    assert gpu.precompile(np.float32) == 0  # once per dtype and process
    if gpu.name == "cuda":
        before = {k: len(k.overloads) for k, _ in signatures(L, np.float32)}
    check = L.check_signatures
    L.check_signatures = True
    try:
        lazy = L.lazy_compiles
        _feed(net, 0)
        net.clear_param_diffs()
        net.forward_backward()
        for p in net.learnable_params:
            gpu.sgd_step(p.dev_flat_data, p.dev_flat_diff, gpu.xp.zeros_like(p.dev_flat_data), 0.9, 0.01, 5e-4)
        assert L.lazy_compiles == lazy, {k: v for k, v in L.lazy.items()}
    finally:
        L.check_signatures = check
    if gpu.name == "cuda":
        assert {k: len(k.overloads) for k, _ in signatures(L, np.float32)} == before


def _name(kernel):
    from kernels.cuda._launch import kernel_name

    return kernel_name(kernel)


def _feed(net, seed, classes=10):
    rng = np.random.default_rng(seed)
    for name in net.inputs:
        shape = net.blobs[name].shape
        if name == "label":
            net.blobs[name].data = rng.integers(0, classes, shape).astype(net.dtype)
        else:
            net.blobs[name].data = rng.uniform(0, 1, shape).astype(net.dtype)


# -- fused kernels against numpy ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 1)])
def test_bias_bwd_with_and_without_the_transpose(gpu, shape):
    rng = np.random.default_rng(0)
    dy = rng.standard_normal(shape)
    db0 = rng.standard_normal(shape[1])
    N, M, S = shape
    db = gpu.from_host(db0)
    gpu.bias_bwd(gpu.from_host(dy), db, None)
    np.testing.assert_allclose(gpu.to_host(db), db0 + dy.sum(axis=(0, 2)), rtol=1e-12)
    db = gpu.from_host(db0)
    dout = gpu.xp.zeros((M, N * S))
    gpu.bias_bwd(gpu.from_host(dy), db, dout)
    np.testing.assert_allclose(gpu.to_host(db), db0 + dy.sum(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_array_equal(gpu.to_host(dout), dy.transpose(1, 0, 2).reshape(M, N * S))
    with pytest.raises(ValueError, match="dout must be"):
        gpu.bias_bwd(gpu.from_host(dy), db, gpu.xp.zeros((M + 1, N * S)))


def _xent_reference(x, label, ignore, normalizer):
    from kernels.softmax import FLT_MIN

    e = np.exp(x - x.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    outer, C, inner = x.shape
    lab = label.reshape(outer, inner).astype(int)
    keep = lab != ignore
    o, k = np.nonzero(keep)
    total = -np.log(np.maximum(prob[o, lab[o, k], k], FLT_MIN)).sum()
    count = keep.sum()
    n = normalizer if normalizer > 0 else max(count, 1)
    return prob, total, count, n


@pytest.mark.parametrize("one_block", [True, False])
@pytest.mark.parametrize("normalizer", [0.0, 6.0])
def test_fused_softmax_loss_forward_on_the_device(gpu, one_block, normalizer):
    """backend.softmax_xent_fwd: softmax, loss, normalization and label check in one launch (one
    block), or in three (more positions than the one-block limit: zeroed status, blocks with
    atomics, a finishing launch), against numpy; a bad label gives NaN and its position."""
    from kernels.cuda import _launch, softmax

    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2))
    label = rng.integers(0, 4, (3, 2)).astype(np.float64)
    label[1, 0] = 7  # ignored below
    L = _launch.launcher()
    config = L.config if one_block else _launch.Config(**{**L.config.__dict__, "loss_one_block": 2})
    L2 = L if one_block else _launch.Launcher(L.simulator, config)
    prob = gpu.xp.zeros(x.shape)
    status = gpu.xp.zeros(4)
    loss = gpu.xp.zeros(1)
    L2.launches.reset()
    softmax.softmax_xent_fwd_device(L2, gpu.from_host(x), gpu.from_host(label), 7, True, normalizer, prob, status, loss)
    assert sum(L2.launches.kernels.values()) == (1 if one_block else 3)
    p_ref, total, count, n = _xent_reference(x, label, 7, normalizer)
    np.testing.assert_allclose(gpu.to_host(prob), p_ref, rtol=1e-12)
    np.testing.assert_allclose(gpu.to_host(status), [total, count, np.inf, n], rtol=1e-12)
    np.testing.assert_allclose(gpu.to_host(loss), [total / n], rtol=1e-12)
    label[2, 1] = 4  # outside [0, 4): flat position 2*2 + 1
    softmax.softmax_xent_fwd_device(L2, gpu.from_host(x), gpu.from_host(label), 7, True, normalizer, prob, status, loss)
    assert gpu.to_host(status)[2] == 5 and np.isnan(gpu.to_host(loss)[0])


def test_sgd_step_with_the_rate_on_the_device_equals_the_number(gpu):
    rng = np.random.default_rng(2)
    w0, g0, h0 = (rng.standard_normal(11).astype(np.float32) for _ in range(3))
    out = []
    for rate in (0.01, gpu.from_host(np.array([0.01], np.float32))):
        w, g, h = (gpu.from_host(a) for a in (w0, g0, h0))
        gpu.sgd_step(w, g, h, 0.9, rate, 5e-4)
        out.append((gpu.to_host(w), gpu.to_host(h)))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


# -- launches per LeNet training step ---------------------------------------------------------------------
#: one LeNet training iteration (batch 2: the counts do not depend on the batch) as
#: enable_graph's step runs it, counted by the launcher: numba kernels, and the array operations
#: that are each one kernel on a GPU (CuPy's, cuBLAS's).  Before the launch-overhead work the same
#: step (Solver.step's) made 20 kernel launches, 54 array operations and 5 host waits (docs/GPU.md).
LENET_STEP_KERNELS = 16
LENET_STEP_XP_OPS = 23


def lenet_solver(tmp_path, be):
    """SGD on LeNet with Input layers (both in front), fed by the test."""
    text = lenet_train_text(2)
    label = 'layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }\n'
    text = text.replace(label, "")
    head, sep, rest = text.partition('layer {\n  name: "conv1"')
    if not sep:
        head, sep, rest = text.partition('layer { name: "conv1"')
    (tmp_path / "lenet.prototxt").write_text(head + label + sep + rest)
    (tmp_path / "solver.prototxt").write_text(
        'net: "lenet.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 5e-4\nlr_policy: "fixed"\n'
        "display: 0\nrandom_seed: 1\n"
    )
    return caffe.SGDSolver(str(tmp_path / "solver.prototxt"), log=lambda m: None, backend=be)


def test_launches_per_lenet_training_step(gpu, L, tmp_path):
    """The count after the launch-overhead work; undoing a fusion (the bias gradients, the fused
    loss forward and its device-side scale, the one-launch update of every parameter, the one
    fill of every gradient) raises it, and a host wait inside fails the capture check."""
    if not L.simulator:
        pytest.skip("array operations are counted by the simulator's arrays only")
    solver = lenet_solver(tmp_path, gpu)
    step = solver.enable_graph("check")
    _feed(solver.net, 0)
    step.iteration(0.01)  # uploads the filled weights and the rate, allocates the scratch
    _feed(solver.net, 1)
    L.launches.reset()
    step.iteration(0.01)
    c = L.launches.snapshot()
    detail = (dict(L.launches.kernels), dict(L.launches.xp_ops))
    assert c["kernels"] == LENET_STEP_KERNELS, detail
    assert c["xp_ops"] == LENET_STEP_XP_OPS, detail
    # the only host waits: the batch's two uploads in the prologue (data, label), none in the body
    assert dict(L.launches.host_syncs) == {"set()": 2}


# -- a step the host never waits in: capture mode -------------------------------------------------------------
def test_capture_mode_refuses_every_host_round_trip(gpu, L):
    """The launcher's copies and syncs raise on both targets; on cudasim the device arrays' scalar
    reads too (on a GPU, CuPy itself refuses those inside a real stream capture)."""
    from kernels.cuda._launch import CaptureViolation

    x = gpu.from_host(np.ones(3, np.float32))
    actions = [
        ("to_host", lambda: gpu.to_host(x)),
        ("from_host", lambda: gpu.from_host(np.ones(3))),
        ("synchronization", gpu.synchronize),
    ]
    if gpu.name == "cudasim":
        actions += [("float()", lambda: float(x.sum())), ("bool()", lambda: bool((x > 0).all()))]
    for what, action in actions:
        with pytest.raises(CaptureViolation, match="inside the planted step"):
            with gpu.capturing("the planted step"):
                action()
    gpu.to_host(x)  # capture mode is left again


def test_the_default_forward_waits_for_the_host_and_the_deferred_one_does_not(gpu):
    net = caffe.Net(lenet_train_text(2), caffe.TRAIN, backend=gpu)
    _feed(net, 1)
    for b in list(net.blobs.values()) + net.learnable_params:
        _ = b.dev_flat_data, b.dev_flat_diff  # the uploads of the first step, done before
    with pytest.raises(Exception, match="device->host copy"):
        with gpu.capturing("a default step"):
            net.forward_from_to()  # reads the label check's status and the loss
    net.set_deferred_checks(True)
    with gpu.capturing("a deferred step"):
        loss = net.forward_device()
        net.backward_from_to()
    assert np.isfinite(float(gpu.to_host(loss)))


def test_a_deferred_bad_label_is_named_when_checked(gpu):
    net = caffe.Net(lenet_train_text(2), caffe.TRAIN, backend=gpu)
    _feed(net, 2)
    net.blobs["label"].data = np.array([3, 12], np.float32)
    net.set_deferred_checks(True)
    loss = net.forward_device()
    assert np.isnan(float(gpu.to_host(loss)))
    with pytest.raises(LayerError, match=r"loss.*label 12, outside \[0, 10\) for 10 classes \(item 1\)"):
        net.check_deferred()
    net.set_deferred_checks(False)
    with pytest.raises(LayerError, match="label 12"):
        net.forward()


SOLVER_NET = """
name: "dummy"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 2 dim: 1 dim: 5 dim: 5 } shape { dim: 2 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def make_solver(tmp_path, be, net=SOLVER_NET, **extra):
    (tmp_path / "net.prototxt").write_text(net)
    fields = {"base_lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "lr_policy": '"step"', "gamma": 0.5}
    fields.update({"stepsize": 2, "max_iter": 10, "display": 2, "random_seed": 1, "average_loss": 3}, **extra)
    text = 'net: "net.prototxt"\n' + "".join(f"{k}: {v}\n" for k, v in fields.items())
    (tmp_path / "solver.prototxt").write_text(text)
    log = []
    return caffe.SGDSolver(str(tmp_path / "solver.prototxt"), log=log.append, backend=be), log


def test_solver_step_in_capture_mode_equals_the_ordinary_step(gpu, tmp_path):
    """enable_graph('check'): every iteration's device part runs in capture mode (a host round
    trip inside would raise), the losses are read at display time; the parameters, the smoothed
    loss and the lr steps equal the ordinary Solver.step's."""
    if gpu.name != "cudasim":
        pytest.skip("the capture check is the simulator's proof; the cuda case replays a graph (below)")
    plain, _ = make_solver(tmp_path, gpu)
    plain.step(5)
    caffe.set_random_seed(1)
    checked, log = make_solver(tmp_path, gpu)
    checked.enable_graph("check")
    gpu.transfers.reset()
    checked.step(5)
    t = gpu.transfers.snapshot()
    # 5 batches (DummyData refills its gaussian top each iteration, its constant label top once),
    # the rates at iterations 0, 2 and 4 (lr_policy step, stepsize 2); the kept losses read at
    # the display lines of iterations 0, 2 and 4: nothing else crosses
    assert (t["h2d"], t["d2h"]) == (5 + 1 + 3, 3), t
    for a, b in zip(plain.net.learnable_params, checked.net.learnable_params):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-6, atol=1e-7)
    assert checked.smoothed_loss == pytest.approx(plain.smoothed_loss, rel=1e-6)
    assert any("check mode" in line for line in log)


def test_enable_graph_says_what_it_needs(gpu, tmp_path):
    s, _ = make_solver(tmp_path, gpu)
    if gpu.name == "cudasim":
        with pytest.raises(SolverError, match="needs the real cuda backend.*enable_graph\\('check'\\)"):
            s.enable_graph()
    s2, _ = make_solver(tmp_path, gpu, clip_gradients=1.0)
    with pytest.raises(SolverError, match="clip_gradients"):
        s2.enable_graph("check")
    with pytest.raises(SolverError, match="mode must be one of"):
        s.enable_graph("fast")


def test_a_bad_label_in_a_checked_run_names_the_layer(gpu, tmp_path):
    if gpu.name != "cudasim":
        pytest.skip("capture check: the simulator's")
    bad = SOLVER_NET.replace('data_filler { type: "constant" value: 1 }', 'data_filler { type: "constant" value: 5 }')
    s, _ = make_solver(tmp_path, gpu, net=bad)  # every label 5: outside [0, 3)
    s.enable_graph("check")
    with pytest.raises(LayerError, match=r"layer 'loss'.*label 5, outside \[0, 3\)"):
        s.step(3)


@pytest.mark.gpu
def test_graph_replay_equals_the_ordinary_step_on_a_gpu(gpu, tmp_path):
    if gpu.name != "cuda":
        pytest.skip("CUDA graphs need the real GPU; the simulator checks the capture contract above")
    plain, _ = make_solver(tmp_path, gpu)
    plain.step(6)
    caffe.set_random_seed(1)
    replayed, _ = make_solver(tmp_path, gpu)
    replayed.enable_graph("graph")
    replayed.step(6)
    for a, b in zip(plain.net.learnable_params, replayed.net.learnable_params):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-5, atol=1e-6)
    assert replayed.smoothed_loss == pytest.approx(plain.smoothed_loss, rel=1e-5)


def test_train_tool_cuda_graph_flag_says_what_it_needs(tmp_path, capsys):
    """``python -m minicaffe.train ... --cuda-graph`` on a backend that cannot capture ends with
    one line saying why (the run directory keeps its log)."""
    from minicaffe import data
    from minicaffe.tools import train

    rng = np.random.default_rng(0)
    data.register_dataset("graph_set", rng.integers(0, 255, (8, 1, 4, 4), dtype=np.uint8), rng.integers(0, 3, 8))
    try:
        (tmp_path / "net.prototxt").write_text(
            'layer { name: "d" type: "Data" top: "data" top: "label" data_param { source: "graph_set" batch_size: 4 } }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }\n'
            'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n'
        )
        (tmp_path / "solver.prototxt").write_text(
            'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 2\ndisplay: 1\nrandom_seed: 1\n'
        )
        out = tmp_path / "run"
        assert train.main([str(tmp_path / "solver.prototxt"), "--output", str(out), "--no-plot", "--cuda-graph"]) == 1
        printed = capsys.readouterr().out
        assert "needs the real cuda backend" in printed and "runs on 'cpu'" in printed, printed
    finally:
        data.unregister_dataset("graph_set")
