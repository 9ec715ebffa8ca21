"""Solvers: lr policies, every update rule against a float64 numpy reference, iter_size,
gradient clipping, snapshots and a bit-exact resume, and the errors users hit."""

import collections
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import data, proto
from minicaffe.errors import SolverError
from minicaffe.solvers import SOLVERS, get_solver, lr_policy

NET = """
name: "toy"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 }
        data_param { source: "toy_set?shuffle=false" batch_size: BATCH } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture(autouse=True)
def toy_dataset():
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(8, 1, 3, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=8)
    data.register_dataset("toy_set", images, labels)
    yield images, labels
    data.unregister_dataset("toy_set")


def solver_param(tmp_path, batch=8, **fields):
    net = tmp_path / "toy.prototxt"
    net.write_text(NET.replace("BATCH", str(batch)))
    settings = {"base_lr": 0.1, "lr_policy": '"fixed"', "max_iter": 10, "display": 0, "random_seed": 3}
    settings.update(fields)
    text = f'net: "{net}"\n' + "".join(f"{k}: {v}\n" for k, v in settings.items())
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    return str(path)


# -- lr policies ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy, fields, it, expected",
    [
        ("fixed", {}, 50, 0.1),
        ("step", {"gamma": 0.5, "stepsize": 10}, 25, 0.1 * 0.25),
        ("exp", {"gamma": 0.99}, 7, 0.1 * 0.99**7),
        ("inv", {"gamma": 1e-4, "power": 0.75}, 1000, 0.1 * (1 + 1e-4 * 1000) ** -0.75),
        ("poly", {"power": 2.0, "max_iter": 100}, 30, 0.1 * (1 - 0.3) ** 2),
        ("sigmoid", {"gamma": -0.1, "stepsize": 20}, 25, 0.1 / (1 + np.exp(0.1 * 5))),
    ],
)
def test_lr_policies(policy, fields, it, expected):
    p = proto.Message("SolverParameter", base_lr=0.1, lr_policy=policy, **fields)
    lr_policy.check(p)
    assert lr_policy.learning_rate(p, it) == pytest.approx(expected, rel=1e-12)


def test_multistep_advances_through_the_solver(tmp_path):
    s = caffe.SGDSolver(
        solver_param(tmp_path, lr_policy='"multistep"', gamma=0.1, stepvalue="3\nstepvalue: 5"), log=lambda m: None
    )
    rates = []
    for _ in range(7):
        rates.append(s.learning_rate())
        s.iter += 1
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_policy_errors():
    with pytest.raises(SolverError, match="unknown lr_policy 'stpe'.*did you mean 'step'"):
        lr_policy.check(proto.Message("SolverParameter", lr_policy="stpe"))
    with pytest.raises(SolverError, match="'step' needs 'stepsize'"):
        lr_policy.check(proto.Message("SolverParameter", lr_policy="step", gamma=0.1))


# -- update rules against a float64 reference -----------------------------------------------------
def reference_rule(kind, p, w, g, state, lr, it):
    """One Caffe update of parameter w (float64) with gradient g (already regularized)."""
    m, delta = p.momentum, p.delta
    if kind == "SGD":
        state.setdefault("h", np.zeros_like(w))
        state["h"] = m * state["h"] + lr * g
        return w - state["h"]
    if kind == "Nesterov":
        h = state.setdefault("h", np.zeros_like(w))
        new = m * h + lr * g
        state["h"] = new
        return w - ((1 + m) * new - m * h)
    if kind == "AdaGrad":
        state["s"] = state.get("s", np.zeros_like(w)) + g * g
        return w - lr * g / (np.sqrt(state["s"]) + delta)
    if kind == "RMSProp":
        d = p.rms_decay
        state["s"] = d * state.get("s", np.zeros_like(w)) + (1 - d) * g * g
        return w - lr * g / (np.sqrt(state["s"]) + delta)
    if kind == "AdaDelta":
        s = m * state.get("s", np.zeros_like(w)) + (1 - m) * g * g
        x = state.get("x", np.zeros_like(w))
        u = g * np.sqrt(x + delta) / np.sqrt(s + delta)
        state["s"], state["x"] = s, m * x + (1 - m) * u * u
        return w - lr * u
    if kind == "Adam":
        b1, b2, t = p.momentum, p.momentum2, it + 1
        a = b1 * state.get("a", np.zeros_like(w)) + (1 - b1) * g
        b = b2 * state.get("b", np.zeros_like(w)) + (1 - b2) * g * g
        state["a"], state["b"] = a, b
        return w - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * a / (np.sqrt(b) + delta)
    raise AssertionError(kind)


RULE_FIELDS = {
    "SGD": {"momentum": 0.9, "weight_decay": 0.01},
    "Nesterov": {"momentum": 0.9, "weight_decay": 0.01},
    "AdaGrad": {"weight_decay": 0.01},
    "RMSProp": {"rms_decay": 0.9, "weight_decay": 0.01},
    "AdaDelta": {"momentum": 0.95, "delta": 1e-6, "weight_decay": 0.01},
    "Adam": {"momentum": 0.9, "momentum2": 0.999, "delta": 1e-8, "weight_decay": 0.01},
}


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_update_rule_matches_reference(kind, tmp_path):
    path = solver_param(tmp_path, type=f'"{kind}"', **RULE_FIELDS[kind])
    solver = get_solver(path, log=lambda m: None)
    assert solver.type == kind
    net = solver.net
    p = solver.param
    ref = caffe.Net(solver.net_path, caffe.TRAIN)  # computes gradients at the reference weights
    weights = [b.data.astype(np.float64) for b in net.learnable_params]
    states = [dict() for _ in weights]
    for it in range(3):
        for b, w in zip(ref.learnable_params, weights):
            b.data[...] = w
        ref.clear_param_diffs()
        ref.forward_backward()
        for i, b in enumerate(ref.learnable_params):
            g = b.diff.astype(np.float64) + p.weight_decay * ref.params_weight_decay[i] * weights[i]
            weights[i] = reference_rule(kind, p, weights[i], g, states[i], p.base_lr * ref.params_lr[i], it)
        solver.step(1)
    for i, (b, w) in enumerate(zip(net.learnable_params, weights)):
        np.testing.assert_allclose(b.data, w, rtol=2e-4, atol=2e-6, err_msg=f"{kind}: parameter {i}")


def test_adagrad_refuses_momentum(tmp_path):
    with pytest.raises(SolverError, match="momentum cannot be used with AdaGrad"):
        get_solver(solver_param(tmp_path, type='"AdaGrad"', momentum=0.9), log=lambda m: None)


def test_iter_size_accumulates_like_a_bigger_batch(tmp_path):
    a = caffe.SGDSolver(solver_param(tmp_path, batch=8, momentum=0.9), log=lambda m: None)
    b = caffe.SGDSolver(solver_param(tmp_path, batch=4, momentum=0.9, iter_size=2), log=lambda m: None)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        pb.data[...] = pa.data
    a.step(3)
    b.step(3)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_allclose(pa.data, pb.data, rtol=1e-5, atol=1e-7)


def test_clip_gradients_bounds_the_step(tmp_path):
    lines = []
    s = caffe.SGDSolver(solver_param(tmp_path, base_lr=1.0, clip_gradients=1e-3), log=lines.append)
    before = [b.data.copy() for b in s.net.learnable_params]
    s.step(1)
    # with lr 1 and no momentum, parameter i moved by lr_mult_i x its clipped gradient
    clipped = [(w - b.data) / lr for b, w, lr in zip(s.net.learnable_params, before, s.net.params_lr)]
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in clipped))
    assert norm == pytest.approx(1e-3, rel=1e-3)
    assert any("Gradient clipping" in l for l in lines)


def test_snapshot_and_bit_exact_resume(tmp_path):
    prefix = str(tmp_path / "snap")
    path = solver_param(tmp_path, momentum=0.9, snapshot_prefix=f'"{prefix}"')
    caffe.set_random_seed(0)
    full = caffe.SGDSolver(path, log=lambda m: None)
    losses_full = []
    full.on_iteration.append(lambda s, loss, lr: losses_full.append(loss))
    full.step(4)
    w_state = full.snapshot()
    full.step(4)
    again = caffe.SGDSolver(path, log=lambda m: None)
    losses_resumed = []
    again.on_iteration.append(lambda s, loss, lr: losses_resumed.append(loss))
    again.restore(w_state[1])
    assert again.iter == 4
    again.step(4)
    assert losses_resumed == losses_full[4:]
    for pa, pb in zip(full.net.learnable_params, again.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)
    assert os.path.exists(prefix + "_iter_4.caffemodel") and os.path.exists(prefix + "_iter_4.solverstate")


def test_restore_refuses_another_nets_state(tmp_path):
    s = caffe.SGDSolver(solver_param(tmp_path, snapshot_prefix=f'"{tmp_path}/a"'), log=lambda m: None)
    _, state = s.snapshot()
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    solver_param(other_dir)
    (other_dir / "toy.prototxt").write_text(NET.replace("BATCH", "8").replace("num_output: 6", "num_output: 5"))
    other = caffe.SGDSolver(str(other_dir / "solver.prototxt"), log=lambda m: None)
    with pytest.raises(SolverError, match="a snapshot from another net"):
        other.restore(state)


@pytest.mark.nan_expected
def test_nan_loss_stops_with_message(tmp_path):
    s = caffe.SGDSolver(solver_param(tmp_path, base_lr=1e30), log=lambda m: None)
    with pytest.raises(SolverError, match=r"loss is (nan|inf) at iteration \d+"):
        s.step(10)


def test_solver_errors(tmp_path):
    with pytest.raises(SolverError, match="solver file not found"):
        get_solver(str(tmp_path / "none.prototxt"))
    bad = tmp_path / "bad.prototxt"
    bad.write_text('net: "missing_net.prototxt"\nbase_lr: 0.1\n')
    with pytest.raises(SolverError, match="'missing_net.prototxt' not found"):
        get_solver(str(bad))
    path = solver_param(tmp_path, type='"Adamm"')
    with pytest.raises(SolverError, match="unknown solver type 'Adamm'.*did you mean 'Adam'"):
        get_solver(path)


def test_test_nets_report_outputs(tmp_path):
    lines = []
    path = solver_param(tmp_path, test_iter=2, test_interval=5, test_initialization="false")
    s = caffe.SGDSolver(path, log=lines.append)
    assert len(s.test_nets) == 1
    results = []
    s.on_test.append(lambda solver, i, r: results.append((solver.iter, r)))
    s.solve()
    assert [it for it, _ in results] == [5, 10]
    assert any(l.startswith("    Test net output #0: loss = ") for l in lines)
    assert s.test_nets[0].params["ip1"][0].shares_data_with(s.net.params["ip1"][0])


def test_an_update_reads_the_solver_fields_once_and_follows_their_changes(tmp_path):
    """local_update reads momentum, weight_decay, iter_size and regularization_type once for all
    the parameters (a message field costs ~3 us a read), and a field changed between steps is
    the one the next update uses."""
    s = caffe.SGDSolver(solver_param(tmp_path, momentum=0.9), log=lambda m: None)
    s.step(1)

    class Counting:
        def __init__(self, param):
            self.__dict__["param"], self.__dict__["reads"] = param, collections.Counter()

        def __getattr__(self, name):
            self.reads[name] += 1
            return getattr(self.param, name)

        def __setattr__(self, name, value):
            setattr(self.param, name, value)

    counting = s.param = Counting(s.param)
    s.apply_update()
    assert len(s.net.learnable_params) > 1
    assert counting.reads["momentum"] == 1 and counting.reads["weight_decay"] == 1
    assert counting.reads["iter_size"] == 1 and counting.reads["regularization_type"] == 1
    counting.momentum = 0.0  # plain SGD from now on: the step is lr * gradient exactly
    for p in s.net.learnable_params:
        p.diff[...] = 1.0
    before = [p.data.copy() for p in s.net.learnable_params]
    s.param.weight_decay = 0.0
    rate = s.learning_rate()
    s.apply_update()
    for b, p, lr in zip(before, s.net.learnable_params, s.net.params_lr):
        np.testing.assert_allclose(p.data, b - rate * lr, rtol=1e-6, atol=1e-7)
