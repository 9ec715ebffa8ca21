"""The step plan (minicaffe/parallel/plan.py): which layers form segments, that running them in
lanes gives the layer-by-layer result (within the order of the weight-gradient sums), that the
Net's hooks still see every layer with complete gradients, that a changed batch falls back to
layer calls, and that memory counts a segment as one step."""

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.layer import register
from minicaffe.layers.inner_product import InnerProduct
from minicaffe.memory import lifetimes, plan_net
from minicaffe.parallel import lanes, plan

# LeNet's layers (AVE pooling and a second ReLU added, so both pooling kernels and an in-place
# neuron run in lanes), fed by an Input layer; batch 7: the lanes' slices are unequal.
NET = """
name: "lenetish"
layer { name: "in" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 7 dim: 1 dim: 16 dim: 16 } shape { dim: 7 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 5 weight_filler { type: "xavier" }
                            bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 6 kernel_size: 3 weight_filler { type: "xavier" }
                            bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 40 weight_filler { type: "xavier" } bias_filler { type: "uniform" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture
def restore(monkeypatch):
    """Lane count and plan switch restored after the test; every InnerProduct of the small test
    net counts as big enough for a lane (its products are far below lanes.MIN_FLOPS)."""
    monkeypatch.setattr(lanes, "MIN_FLOPS", 0.0)
    saved = lanes.count(), plan.enabled()
    yield
    lanes.set_count(saved[0])
    plan.set_enabled(saved[1])


def _net(tmp_path, n=7, dtype=np.float64):
    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace("dim: 7", f"dim: {n}"))
    caffe.set_random_seed(5)
    net = caffe.Net(str(path), caffe.TRAIN, dtype=dtype)
    _fill(net)
    return net


def _fill(net):
    """The inputs every test feeds (seeded): the arena's allocate() replaces the blobs' storage."""
    g = np.random.default_rng(1)
    net.blobs["data"].data[...] = g.standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = g.integers(0, 5, net.blobs["label"].shape[0])


def _poisoned_losses(net, mem):
    """The inputs again, then two forward-backward passes with every dead buffer poisoned."""
    _fill(net)
    net.clear_param_diffs()
    return [mem.forward_backward_poisoned() for _ in range(2)]


def _step(net):
    """Two forward-backward passes (the parameter gradients accumulate): loss, every top, every
    blob's diff and every parameter's diff."""
    net.clear_param_diffs()
    loss = [net.forward_backward() for _ in range(2)]
    out = [np.array(loss)]
    out += [b.data.copy() for b in net.blob_list] + [b.diff.copy() for b in net.blob_list]
    out += [p.diff.copy() for p in net.learnable_params]
    return out


def test_lenet_is_one_segment_from_conv1_to_relu1():
    net = caffe.Net("nets/lenet_train_test.prototxt", caffe.TRAIN)
    segs = net.step_plan().segments
    assert [(net.layer_names[a], net.layer_names[b]) for a, b in segs] == [("conv1", "relu1")]
    # the data layer, ip2 (0.6 MFLOP: below lanes.MIN_FLOPS, not worth a lane) and the loss (it
    # sums over the batch) stay layer calls
    names = list(net.layer_names)
    for name in ("mnist", "ip2", "loss"):
        assert net.step_plan().segment_of(names.index(name)) is None, name
    ip1 = net.layers[names.index("ip1")]
    assert ip1.params_after_lanes and 2.0 * ip1.M * ip1.K * ip1.num_output >= lanes.MIN_FLOPS


def test_inner_product_weight_gradient_is_the_layer_calls_bit_for_bit(tmp_path, restore):
    """ip1's dW and db by rows after the lanes meet (params_after_lanes) are the products a layer
    call split across the lanes computes: equal to the last bit, unlike the convolutions' per-lane
    partial sums."""
    net = _net(tmp_path, dtype=np.float32)
    lanes.set_count(2)
    ip1 = net.layers[list(net.layer_names).index("ip1")]
    assert ip1.num_output >= 2 * lanes.MIN_ROWS  # a layer call splits its dW rows too
    plan.set_enabled(False)
    _step(net)
    by_layer = [p.diff.copy() for p in ip1.blobs]
    plan.set_enabled(True)
    assert net.uses_step_plan()
    _step(net)
    for p, want in zip(ip1.blobs, by_layer):
        np.testing.assert_array_equal(p.diff, want)


@pytest.mark.parametrize("n_lanes", [2, 3])
def test_plan_gives_the_layer_by_layer_result(tmp_path, restore, n_lanes):
    net = _net(tmp_path)
    lanes.set_count(1)
    ref = _step(net)
    lanes.set_count(n_lanes)
    assert net.uses_step_plan()
    got = _step(net)
    plan.set_enabled(False)
    assert not net.uses_step_plan()
    by_layer = _step(net)
    for r, g, b in zip(ref, got, by_layer):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(b, r, rtol=1e-12, atol=1e-13)


def test_hooks_see_every_layer_once_with_complete_gradients(tmp_path, restore):
    net = _net(tmp_path)
    lanes.set_count(2)
    _step(net)  # warm: the reference gradients of one pass
    net.clear_param_diffs()
    net.forward_backward()
    want = [p.diff.copy() for p in net.learnable_params]
    calls, seen = [], {}

    def note(kind):
        return lambda i: calls.append((kind, i))

    def ready(i):  # wait-free backprop sends layer i's gradients here: they must be complete
        calls.append(("after_backward", i))
        for j in net.layer_param_indices[i]:
            seen[j] = net.learnable_params[j].diff.copy()

    net.clear_param_diffs()
    with net.add_hooks(
        before_forward=note("before_forward"),
        after_forward=note("after_forward"),
        before_backward=note("before_backward"),
        after_backward=ready,
    ):
        net.forward_backward()
    L = len(net.layers)
    order = lambda kind: [i for k, i in calls if k == kind]  # noqa: E731
    assert order("before_forward") == order("after_forward") == list(range(L))
    back = [i for i in range(L - 1, -1, -1) if net.layer_need_backward[i]]
    assert order("before_backward") == order("after_backward") == back
    # each layer's before comes before its after, forward before backward
    pos = {c: k for k, c in enumerate(calls)}
    assert all(pos[("before_forward", i)] < pos[("after_forward", i)] for i in range(L))
    assert all(pos[("after_forward", L - 1)] < pos[("before_backward", i)] for i in back)
    assert sorted(seen) == list(range(len(want)))
    for j, w in enumerate(want):
        np.testing.assert_allclose(seen[j], w, rtol=1e-12, atol=1e-13)


def test_a_batch_that_no_longer_splits_runs_layer_by_layer(tmp_path, restore):
    """Batch 1 after the plan was built: nothing to split, the layers run one call each (and a
    partial range runs its segments' layers one by one); results as with one lane."""
    net = _net(tmp_path)
    lanes.set_count(2)
    _step(net)
    net.blobs["data"].reshape(1, 1, 16, 16)
    net.blobs["label"].reshape(1)
    net.reshape()
    net.blobs["data"].data[...] = 0.5
    net.blobs["label"].data[...] = 2
    got = _step(net)
    lanes.set_count(1)
    ref = _step(net)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)
    lanes.set_count(2)
    full = net.forward()["loss"].copy()
    assert net.forward(end="pool2") and net.forward(start="ip1")["loss"] == pytest.approx(float(full))


def test_memory_counts_a_segment_as_one_step(tmp_path, restore):
    """Every buffer a segment touches is live at its one step (lane 0 may run layers ahead of
    lane 1), so no two of them share bytes; the net then trains in its arena, dead bytes
    poisoned before every step, as it did with its own arrays."""
    net = _net(tmp_path, dtype=np.float32)
    ((a, b),) = net.step_plan().segments
    lanes.set_count(1)
    assert lifetimes.steps(net)[1](b) == b  # one lane: every layer its own step
    lanes.set_count(2)
    n_steps, fwd, bwd = lifetimes.steps(net)
    assert {fwd(i) for i in range(a, b + 1)} == {a}
    assert {bwd(i) for i in range(a, b + 1)} == {n_steps - 1 - b}
    ref = _step(net)
    mem = plan_net(net)
    mem.check()  # no two buffers live at one step share a byte
    in_segment = [x for x in mem.buffers if x.nbytes and x.live_at(a)]
    assert {"conv1.data", "pool1.data", "conv2.data", "ip2.data", "conv2:dparams"} <= {x.name for x in in_segment}
    assert "ip1:dparams" not in {x.name for x in mem.buffers}  # its gradient is made by rows, no partials
    mem.allocate()
    losses = _poisoned_losses(net, mem)
    np.testing.assert_allclose(losses, ref[0], rtol=1e-6)
    for p, r in zip(net.learnable_params, ref[-len(net.learnable_params) :]):
        np.testing.assert_allclose(p.diff, r, rtol=1e-5, atol=1e-6)


def test_an_arena_planned_for_one_lane_never_runs_segments(tmp_path, restore):
    """Planned at one lane (layers that follow each other may share bytes), the net must not
    start running segments at two: it runs layer by layer, each call split on its own."""
    net = _net(tmp_path, dtype=np.float32)
    lanes.set_count(1)
    ref = _step(net)
    mem = plan_net(net)
    mem.allocate()
    lanes.set_count(2)
    assert not net.uses_step_plan() and net.step_plan().segments == []
    losses = _poisoned_losses(net, mem)
    np.testing.assert_allclose(losses, ref[0], rtol=1e-6)


def test_time_tool_times_segment_layers_inside_the_lanes(tmp_path, restore, capsys):
    from minicaffe.tools import timing

    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    assert timing.main([str(path), "--iterations", "3", "--warmup", "1", "--lanes", "2", "--no-roofline"]) == 0
    text = capsys.readouterr().out
    assert "step plan on" in text
    rows = {line.split()[1]: line for line in text.splitlines() if "forward:" in line and "segment" not in line}
    assert "%)*" in rows["conv1"] and "%)*" in rows["ip2"] and "%)*" not in rows["loss"]
    assert "segment conv1 .. ip2" in text and "hand-off" in text
    assert plan.enabled() and lanes.count() == 1  # restored
    assert (
        timing.main([str(path), "--iterations", "3", "--warmup", "1", "--lanes", "2", "--no-roofline", "--no-plan"])
        == 0
    )
    text = capsys.readouterr().out
    assert "step plan off" in text and "* segment" not in text and "%)*" not in text


def test_a_lenet_step_in_two_lanes_allocates_no_temporaries(tmp_path, restore):
    """After warm-up, a whole LeNet training step (batch 64, Caffe's SGD solver) run by the step
    plan in two lanes -- forward, backward, the lanes' gradient reduction, the update --
    allocates no array of a blob's size: tracemalloc (which sees numpy's buffers, on every
    thread; not numba's own) peaks at less than two lanes' ufunc buffers above the start."""
    import re
    import tracemalloc

    from minicaffe.solvers import get_solver

    text = open("nets/lenet_train_test.prototxt").read()
    parts = [p for p in re.split(r"(?=\nlayer \{)", text) if 'type: "Data"' not in p]
    memory_data = (
        '\nlayer { name: "mnist" type: "MemoryData" top: "data" top: "label"\n'
        "  memory_data_param { batch_size: 64 channels: 1 height: 28 width: 28 } }"
    )
    (tmp_path / "lenet.prototxt").write_text(parts[0] + memory_data + "".join(parts[1:]))
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "lenet.prototxt"}" base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 '
        'lr_policy: "inv" gamma: 0.0001 power: 0.75 max_iter: 100 display: 0 random_seed: 1\n'
    )
    lanes.set_count(2)
    solver = get_solver(str(tmp_path / "solver.prototxt"), log=lambda m: None)
    g = np.random.default_rng(0)
    solver.net.layers[0].set_input_arrays(
        g.integers(0, 256, (256, 1, 28, 28)).astype(np.float32) / 256, g.integers(0, 10, 256)
    )
    assert solver.net.uses_step_plan()
    solver.step(3)  # warm-up: kernels compiled or loaded, every buffer at its size
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        solver.step(4)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    # numpy's ufuncs keep up to two 8192-element buffers (64 KiB in float32) while they add a
    # transposed array (the convolutions' bias epilogue), and both lanes may do so at once: the
    # limit is twice test_memory_training's one-lane PHASE_LIMIT.  It catches a temporary of a
    # lane's half of conv1, pool1 or conv2 (1.5 MB, 369 KB, 410 KB), of a column buffer or of
    # ip1's 1.6 MB weight gradient; not one as small as a lane's half of pool2 (102 KB)
    assert peak < 2 * 72 * 1024, f"a LeNet step in two lanes allocated {peak} bytes above its start"


# -- a lane that fails inside a segment: the error comes back, nobody waits forever -------------------
_FAIL = {"where": None, "lane": None}


@register
class _FailingInnerProduct(InnerProduct):
    """InnerProduct that raises in lane ``_FAIL["lane"]``, in its per-image backward (before the
    lanes meet at the barrier) or in its rows of the weight gradient (after it)."""

    type = "PlanTestFailingInnerProduct"

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        if _FAIL["where"] == "images" and lane == _FAIL["lane"]:
            raise RuntimeError(f"boom in lane {lane}")
        super().backward_images(lane, a, b, top, propagate_down, bottom)

    def backward_params(self, lane, parts, top, bottom):
        if _FAIL["where"] == "params" and lane == _FAIL["lane"]:
            raise RuntimeError(f"boom in lane {lane}")
        super().backward_params(lane, parts, top, bottom)


@pytest.mark.parametrize("where", ["images", "params"])
@pytest.mark.parametrize("lane", [0, 1])
def test_a_lane_failing_in_a_segment_raises_its_error_and_the_lanes_go_on(tmp_path, restore, where, lane):
    """ip1's rows of dW come right after its per-image backward, once every lane is there (a
    barrier): a lane that fails before the barrier releases the others, one that fails after it
    is reported as any other; the backward raises that error, no lane hangs, and the next step
    runs normally."""
    import threading

    path = tmp_path / "net.prototxt"
    path.write_text(NET.replace('name: "ip1" type: "InnerProduct"', 'name: "ip1" type: "PlanTestFailingInnerProduct"'))
    caffe.set_random_seed(5)
    net = caffe.Net(str(path), caffe.TRAIN)
    _fill(net)
    lanes.set_count(2)
    assert net.uses_step_plan()
    names = list(net.layer_names)
    assert net.step_plan().segment_of(names.index("ip1")) is not None
    result = {}

    def step():
        try:
            net.forward_backward()
        except RuntimeError as e:
            result["error"] = str(e)

    _FAIL.update(where=where, lane=lane)
    try:
        t = threading.Thread(target=step, daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "a lane is still waiting at the barrier"
    finally:
        _FAIL.update(where=None, lane=None)
    assert result.get("error") == f"boom in lane {lane}"
    net.clear_param_diffs()
    assert np.isfinite(net.forward_backward())
