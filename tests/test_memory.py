"""The memory arena: placement invariants, flat parameters, the report, and the poison test:
every net we ship gives the same losses and gradients when every byte that the plan says is
dead is overwritten with 0xFF (NaN as float, -1 as int) before every step."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minicaffe as caffe
from minicaffe import proto
from minicaffe.layers.data_base import DataLayer
from minicaffe.memory import Buffer, ParamLayout, peak_bytes, place, plan_memory, plan_net
from minicaffe.memory.planner import align_up, plan_solver
from minicaffe.memory.report import report_text
from minicaffe.parallel import with_synthetic_data

NETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")


def buf(name, nbytes, intervals):
    return Buffer(name, "test", nbytes, np.uint8, intervals, lambda flat: None)


# -- placement --------------------------------------------------------------------------------
def test_disjoint_lifetimes_share_and_overlapping_do_not():
    a, b, c = buf("a", 1000, [(0, 2)]), buf("b", 1000, [(3, 5)]), buf("c", 100, [(2, 3)])
    size = place([a, b, c])
    assert a.offset == b.offset == 0  # a and b never live together
    assert c.offset >= align_up(1000)  # c meets both
    assert size == align_up(1000) + align_up(100)


def test_persistent_and_unused_buffers():
    p, q = buf("p", 64, None), buf("q", 64, None)
    never = buf("never", 500, [])
    place([p, q, never])
    assert p.offset != q.offset  # two persistent buffers never share
    assert never.offset == 0  # a buffer nobody uses conflicts with nothing


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 5000), st.integers(0, 9), st.integers(0, 9), st.booleans()), min_size=1, max_size=25
    )
)
def test_random_buffers_never_overlap_while_live(specs):
    bufs = [
        buf(f"b{i}", n, None if persistent else [(min(s, e), max(s, e))])
        for i, (n, s, e, persistent) in enumerate(specs)
    ]
    size = place(bufs)
    for i, x in enumerate(bufs):
        for y in bufs[i + 1 :]:
            if x.overlaps(y):
                assert x.offset + x.nbytes <= y.offset or y.offset + y.nbytes <= x.offset, (x, y)
    assert size >= peak_bytes(bufs, 10)
    assert size <= sum(align_up(b.nbytes) for b in bufs)


# -- flat parameters --------------------------------------------------------------------------
SHARED = """
name: "shared"
input: "x" input_shape { dim: 2 dim: 3 }
layer { name: "a" type: "InnerProduct" bottom: "x" top: "a" param { name: "w" } param { name: "b" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "c" type: "InnerProduct" bottom: "a" top: "c" param { name: "w" } param { name: "b" }
        inner_product_param { num_output: 3 } }
layer { name: "d" type: "InnerProduct" bottom: "c" top: "d" inner_product_param { num_output: 2 } }
"""


def test_flat_params_keep_values_and_shared_blobs_share_a_slice():
    caffe.set_random_seed(3)
    net = caffe.Net(SHARED, caffe.TRAIN)
    before = [p.data.copy() for p in net.learnable_params]
    layout = ParamLayout(net)
    W, G = np.empty(layout.count, np.float32), np.empty(layout.count, np.float32)
    layout.attach_data(W)
    layout.attach_diff(G)
    for p, v in zip(net.learnable_params, before):
        np.testing.assert_array_equal(p.data, v)
        assert np.shares_memory(p.data, W) and np.shares_memory(p.diff, G)
    a, c = net.layer_dict["a"].blobs[0], net.layer_dict["c"].blobs[0]
    assert np.shares_memory(a.data, c.data) and np.shares_memory(a.diff, c.diff)
    assert layout.count == 3 * 3 + 3 + 3 * 2 + 2


# -- poison: every net we ship -----------------------------------------------------------------
def _load(name, batch=8):
    param = proto.parse_file(os.path.join(NETS, name), "NetParameter")
    param = with_synthetic_data(param, count=64, shuffle=False)
    for lp in param.layer:
        if lp.type == "Data" and batch:
            lp.data_param.batch_size = batch
    return param


def _reference_then_poisoned(net, iters, recompute):
    """Losses and parameter gradients of ``iters`` iterations, unplanned and then planned with
    poison, from the same data positions; the two lists must be equal."""
    states = {i: l.state_dict() for i, l in enumerate(net.layers) if isinstance(l, DataLayer)}
    inputs = {n: np.random.default_rng(5).standard_normal(net.blobs[n].shape).astype(np.float32) for n in net.inputs}

    def run(poisoned, plan=None):
        out = []
        for _ in range(iters):
            for n, v in inputs.items():
                net.blobs[n].data[...] = v
            net.clear_param_diffs()
            loss = plan.forward_backward_poisoned() if poisoned else net.forward_backward()
            outs = {n: net.blobs[n].data.copy() for n in net.outputs}
            out.append((loss, outs, [p.diff.copy() for p in net.learnable_params]))
        return out

    ref = run(False)
    for i, s in states.items():
        net.layers[i].load_state_dict(s)
    plan = plan_memory(net, recompute=recompute)
    for i, s in states.items():
        net.layers[i].load_state_dict(s)
    got = run(True, plan)
    for it, ((la, oa, ga), (lb, ob, gb)) in enumerate(zip(ref, got)):
        assert la == lb or (np.isnan(la) and np.isnan(lb)), f"iteration {it}: loss {la} vs {lb}"
        for n in oa:
            np.testing.assert_array_equal(oa[n], ob[n], err_msg=f"iteration {it}: output {n}")
        for k, (a, b) in enumerate(zip(ga, gb)):
            np.testing.assert_array_equal(a, b, err_msg=f"iteration {it}: gradient of {net.learnable_params[k].name}")
    return plan


TRAIN_NETS = ["lenet_train_test.prototxt", "cifar10_quick_train_test.prototxt", "cifar10_full_train_test.prototxt"]


@pytest.mark.parametrize("recompute", [False, True], ids=["keep-columns", "recompute"])
@pytest.mark.parametrize("name", TRAIN_NETS)
def test_poison_training_nets(name, recompute):
    caffe.set_random_seed(1)
    net = caffe.Net(_load(name), caffe.TRAIN)
    plan = _reference_then_poisoned(net, iters=2, recompute=recompute)
    assert plan.size <= plan.naive
    assert plan.size >= plan.peak


@pytest.mark.parametrize("name", TRAIN_NETS + ["lenet.prototxt"])
def test_poison_test_phase_nets(name):
    caffe.set_random_seed(1)
    net = caffe.Net(_load(name), caffe.TEST)
    _reference_then_poisoned(net, iters=2, recompute=False)


@pytest.mark.slow
def test_poison_caffenet_forward_and_forced_backward():
    """CaffeNet at batch 1 (61 M parameters: about 20 s on 2 cores)."""
    param = _load("caffenet_deploy.prototxt")
    param.input_shape[0].dim[0] = 1
    param.force_backward = True
    caffe.set_random_seed(1)
    net = caffe.Net(param, caffe.TEST)
    _reference_then_poisoned(net, iters=1, recompute=True)


def test_poison_catches_a_wrong_scratch_span(monkeypatch):
    """The harness is not vacuous: a Pooling that declares its mask dead after forward makes the
    poisoned run differ."""
    from minicaffe.layer import Scratch
    from minicaffe.layers.pooling import Pooling

    declared = Pooling.scratch
    monkeypatch.setattr(Pooling, "scratch", lambda self: [Scratch(*s[:3], "call") for s in declared(self)])
    caffe.set_random_seed(1)
    net = caffe.Net(_load("lenet_train_test.prototxt"), caffe.TRAIN)
    with pytest.raises(AssertionError):
        _reference_then_poisoned(net, iters=1, recompute=False)


def test_poison_catches_a_wrong_backward_reads(monkeypatch):
    """... and so does an InnerProduct that declares its backward reads no data."""
    from minicaffe.layers.inner_product import InnerProduct

    monkeypatch.setattr(InnerProduct, "backward_reads", "none")
    caffe.set_random_seed(1)
    net = caffe.Net(_load("lenet_train_test.prototxt"), caffe.TRAIN)
    with pytest.raises(AssertionError):
        _reference_then_poisoned(net, iters=1, recompute=False)


# -- the report ---------------------------------------------------------------------------------
def test_lenet_report_and_target(monkeypatch):
    """The planner's target on convolutions through im2col + GEMM (what it shares is their column
    buffers); with the CPU's direct kernel for conv1 (no columns at all) the arena is smaller still."""
    from minicaffe.backend import cpu
    from minicaffe.solvers import get_solver, load_solver_param

    direct_taps = cpu.DIRECT_MAX_TAPS
    monkeypatch.setattr(cpu, "DIRECT_MAX_TAPS", 0)

    param, _ = load_solver_param(os.path.join(NETS, "lenet_solver.prototxt"))
    param.clear("net")
    param.net_param = _load("lenet_train_test.prototxt", batch=None)  # Caffe's batch of 64
    param.clear("test_iter")
    param.clear("test_interval")
    sizes = {}
    for recompute in (False, True):
        solver = get_solver(param, log=lambda m: None)
        plan = plan_solver(solver, recompute=recompute)
        text = report_text([("LeNet", plan)], title="LeNet")
        for word in (
            "activations",
            "activation diffs",
            "layer scratch",
            "params",
            "solver history",
            "naive total",
            "planned arena",
            "peak live",
        ):
            assert word in text
        sizes[recompute] = plan.size / plan.naive
        arena = plan.size
        solver.step(2)  # trains from the arena
        assert np.isfinite(solver.smoothed_loss)
    assert sizes[True] <= 0.6, sizes  # the target, met when convolutions recompute
    assert sizes[False] < 0.75, sizes
    monkeypatch.setattr(cpu, "DIRECT_MAX_TAPS", direct_taps)
    direct = plan_solver(get_solver(param, log=lambda m: None), recompute=False)
    assert direct.size < arena, (direct.size, arena)


def test_plan_without_a_run_sees_the_scratch_sized_at_setup():
    caffe.set_random_seed(1)
    net = caffe.Net(_load("lenet_train_test.prototxt"), caffe.TRAIN)
    plan = plan_net(net, run_first=False)
    names = {b.name for b in plan.buffers}
    assert "pool1:mask" in names  # allocated by reshape, at setup
    assert {"conv2:col", "conv2:out"} <= names  # Convolution sizes its buffers at reshape too
    by_name = {b.name: b for b in plan.buffers}
    conv2 = net.layers[net.layer_names.index("conv2")]
    assert by_name["conv2:col"].count == conv2.scratch()[0].array.size  # the size its forward uses
