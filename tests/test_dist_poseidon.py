"""Poseidon's cost rule (worked numbers, the per-layer plan of a Net) and sufficient factors:
the gradient rebuilt from u and v equals the layer's own, layer by layer, and summed over
several nodes' factors equals the gradient of the concatenated batch."""

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import proto
from minicaffe.dist import cost, sfb
from minicaffe.errors import LayerError, MinicaffeError

# An MLP that exercises every InnerProduct form SFB handles: the default (axis 1), axis 2
# (rows = every position before the axis) and transpose (W stored N x M).
MLP = """
name: "mlp"
input: "data"  input_shape { dim: BATCH dim: 3 dim: 4 dim: 5 }
input: "label" input_shape { dim: BATCH }
layer { name: "ipa" type: "InnerProduct" bottom: "data" top: "ipa"
        inner_product_param { num_output: 6 axis: 2
          weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relua" type: "ReLU" bottom: "ipa" top: "ipa" }
layer { name: "ipb" type: "InnerProduct" bottom: "ipa" top: "ipb"
        inner_product_param { num_output: 9 transpose: true
          weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: -0.1 } } }
layer { name: "tanhb" type: "TanH" bottom: "ipb" top: "ipb" }
layer { name: "ipc" type: "InnerProduct" bottom: "ipb" top: "ipc" param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ipc" bottom: "label" top: "loss" }
"""
FC = ("ipa", "ipb", "ipc")


def mlp(batch, seed=3):
    caffe.set_random_seed(seed)
    return caffe.Net(MLP.replace("BATCH", str(batch)), caffe.TRAIN)


def batch_of(k, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, 3, 4, 5)).astype(np.float32), rng.integers(0, 4, size=k).astype(np.float32)


def set_batch(net, x, y):
    net.blobs["data"].reshape(x.shape)
    net.blobs["label"].reshape(y.shape)
    net.reshape()
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = y


def gradients(net, names):
    return {n: [b.diff.copy() for b in net.layer_dict[n].blobs] for n in names}


def rel_err(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b.astype(np.float64))), 1e-30))


# -- the cost rule --------------------------------------------------------------------------------
def test_rule_worked_numbers_lenet_ip1():
    # LeNet's ip1: W is 500 x 800, batch K = 64 per node.  On 4 nodes (P1 = P2 = 4):
    # PS  = 2 * 500 * 800 * (4 + 4 - 2) / 4 = 1,200,000 floats
    # SFB = 2 * 64 * (4 - 1) * (500 + 800)   =   499,200 floats  -> SFB
    assert cost.ps_floats(500, 800, 4, 4) == 1_200_000
    assert cost.sfb_floats(64, 500, 800, 4) == 499_200
    # on 16 nodes the broadcast to 15 peers costs more than the server: PS
    assert cost.ps_floats(500, 800, 16, 16) == 1_500_000
    assert cost.sfb_floats(64, 500, 800, 16) == 2_496_000


def test_rule_worked_numbers_alexnet_fc6():
    # AlexNet's fc6: W is 4096 x 9216, K = 256 per node, 8 nodes:
    # PS  = 2 * 4096 * 9216 * 14 / 8   = 132,120,576 floats (528 MB per iteration per node)
    # SFB = 2 * 256 * 7 * (4096 + 9216) =  47,710,208 floats (191 MB)
    assert cost.ps_floats(4096, 9216, 8, 8) == 132_120_576
    assert cost.sfb_floats(256, 4096, 9216, 8) == 47_710_208
    # the crossover: SFB stays cheaper while 2K(P-1)(M+N) <= 4MN(P-1)/P, i.e. K P <= 2MN/(M+N)
    crossover = 2 * 4096 * 9216 / (4096 + 9216)
    for p in (2, 4, 8, 16, 32):
        sfb_wins = cost.sfb_floats(256, 4096, 9216, p) <= cost.ps_floats(4096, 9216, p, p)
        assert sfb_wins == (256 * p <= crossover), p


def lenet_net():
    from minicaffe.parallel import with_synthetic_data
    from minicaffe.tools.common import resolve_net

    param = with_synthetic_data(proto.parse_file(resolve_net("lenet", "train_test"), "NetParameter"), count=128)
    return caffe.Net(param, caffe.TRAIN)


def test_plan_of_lenet():
    net = lenet_net()
    plans = {c.name: c for c in cost.plan(net, 4, host=None)}  # Poseidon's byte rule alone
    assert list(plans) == ["conv1", "conv2", "ip1", "ip2"]
    ip1, ip2 = plans["ip1"], plans["ip2"]
    assert (ip1.m, ip1.n, ip1.k) == (500, 800, 64)
    assert ip1.choice == "sfb" and ip1.floats == 499_200 and ip1.bytes == 4 * 499_200
    # ip2 (10 x 500): PS = 15,000 < SFB = 195,840; its bias (10 floats) adds 2 * 10 * 6 / 4 = 30
    assert ip2.choice == "ps" and ip2.ps_rule == 15_000 and ip2.floats == 15_030
    assert plans["conv1"].choice == "ps" and plans["conv1"].floats == 2 * 520 * 6 / 4
    assert all(c.choice == "ps" for c in cost.plan(net, 4, comm="ps"))
    assert [c.choice for c in cost.plan(net, 4, comm="sfb")] == ["ps", "ps", "sfb", "sfb"]
    assert {c.name: c.choice for c in cost.plan(net, 16)}["ip1"] == "ps"
    # threads in a node add rows: K = 64 x 2 workers
    assert {c.name: c.k for c in cost.plan(net, 4, workers=2)}["ip1"] == 128
    # with every node rebuilding from 4 x 64 rows, SFB pays on a 1 Gbit/s link, not at 10 Gbit/s
    # on this machine's costs (the rebuild's GEMM and the frames outweigh 2.7 MB of CPU-cheap bytes)
    assert {c.name: c.choice for c in cost.plan(net, 4, link_rate=1e9 / 8)}["ip1"] == "sfb"
    assert {c.name: c.choice for c in cost.plan(net, 4, link_rate=10e9 / 8)}["ip1"] == "ps"
    text = cost.format_plan(cost.plan(net, 4, host=None), 4)
    assert "ip1" in text and "SFB" in text and "1,200,000" in text and "499,200" in text


def test_plan_refuses_bad_mode_and_shared_weights():
    with pytest.raises(MinicaffeError, match="--comm"):
        cost.plan(lenet_net(), 4, comm="allreduce")
    text = """
    name: "tied" input: "data" input_shape { dim: 4 dim: 6 }
    layer { name: "a" type: "InnerProduct" bottom: "data" top: "a" param { name: "w" }
            inner_product_param { num_output: 6 bias_term: false weight_filler { type: "xavier" } } }
    layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" }
            inner_product_param { num_output: 6 bias_term: false } }
    layer { name: "l" type: "EuclideanLoss" bottom: "b" bottom: "data" top: "l" }
    """
    net = caffe.Net(text, caffe.TRAIN)
    plans = cost.plan(net, 4, comm="sfb")
    assert [(c.name, c.choice) for c in plans] == [("a", "ps")]
    assert "shares its parameters" in plans[0].reason


def test_cost_cli(capsys):
    assert cost.main(["lenet", "--nodes", "2", "16", "--synthetic", "--batch-per-node"]) == 0
    out = capsys.readouterr().out
    assert out.count("HybComm plan") == 2 and "800,000" in out and "2,496,000" in out
    # by default the net's batch of 64 is the run's: 16 rows per node on 4 nodes
    assert cost.main(["lenet", "--nodes", "4", "--synthetic"]) == 0
    out = capsys.readouterr().out
    assert f"{cost.sfb_floats(16, 500, 800, 4):,.0f}" in out
    assert cost.main(["no_such_net"]) == 1
    assert "no net 'no_such_net'" in capsys.readouterr().err


# -- sufficient factors ---------------------------------------------------------------------------
def test_rebuilt_gradient_equals_the_layers_own():
    net = mlp(8)
    set_batch(net, *batch_of(8))
    idx = [net.layer_names.index(n) for n in FC]
    capture = sfb.FactorCapture(net, idx)
    net.clear_param_diffs()
    net.forward_backward()
    own = gradients(net, FC)
    for name, i in zip(FC, idx):
        f = capture.take(i)
        layer = net.layers[i]
        m = layer.param.inner_product_param.num_output
        assert f.u.shape[1] == m
        assert f.rows == (24 if name == "ipa" else 8)  # axis 2: 8 images x 3 positions
        wg = np.empty_like(layer.blobs[0].diff)
        bg = np.empty_like(layer.blobs[1].diff)
        sfb.rebuild(f, wg, bg, transpose=(name == "ipb"), gemm=net.backend.gemm)
        assert rel_err(wg, own[name][0]) < 1e-5, name
        assert rel_err(bg, own[name][1]) < 1e-5, name
        # numpy's matmul (no backend) gives the same answer
        sfb.rebuild(f, wg, bg, transpose=(name == "ipb"))
        assert rel_err(wg, own[name][0]) < 1e-5, name
    capture.close()
    with pytest.raises(LayerError, match="no factors captured"):
        capture.take(idx[0])


@pytest.mark.parametrize("nodes", [2, 3])
def test_factors_of_several_nodes_rebuild_the_concatenated_batch(nodes):
    k = 4
    x, y = batch_of(k * nodes, seed=nodes)
    whole = mlp(k * nodes)
    set_batch(whole, x, y)
    whole.clear_param_diffs()
    whole.forward_backward()
    want = gradients(whole, FC)

    node = mlp(k)  # same seed: the same initial weights as `whole`
    idx = [node.layer_names.index(n) for n in FC]
    capture = sfb.FactorCapture(node, idx)
    parts = {i: [] for i in idx}
    for p in range(nodes):
        set_batch(node, x[p * k : (p + 1) * k], y[p * k : (p + 1) * k])
        node.clear_param_diffs()
        node.forward_backward()
        for i in idx:
            parts[i].append(capture.take(i))
    for name, i in zip(FC, idx):
        # each node's loss is normalized by its own K rows; the whole batch's by nodes x K
        sfb.rebuild_into_layer(node, i, sfb.SufficientFactors.concatenate(parts[i]), alpha=1.0 / nodes)
        got = [b.diff for b in node.layers[i].blobs]
        for j in range(2):
            assert rel_err(got[j], want[name][j]) < 1e-5, (name, j, rel_err(got[j], want[name][j]))


def test_factor_capture_refuses_layers_without_factors():
    net = mlp(4)
    with pytest.raises(LayerError, match="InnerProduct layers only"):
        sfb.FactorCapture(net, ["relua"])
    frozen = MLP.replace("param { lr_mult: 1 } param { lr_mult: 2 }", "param { lr_mult: 0 } param { lr_mult: 0 }")
    net = caffe.Net(frozen.replace("BATCH", "4"), caffe.TRAIN)
    with pytest.raises(LayerError, match="lr_mult 0"):
        sfb.FactorCapture(net, ["ipc"])
    f = sfb.SufficientFactors(np.zeros((3, 2), np.float32), np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match=r"\(2, 5\)"):
        sfb.rebuild(f, np.zeros((5, 2), np.float32))


def test_factors_accumulate_over_iter_size():
    # two backward passes before a take: the rows concatenate, as the layer's diff accumulates
    net = mlp(4)
    i = net.layer_names.index("ipc")
    capture = sfb.FactorCapture(net, [i])
    net.clear_param_diffs()
    for s in range(2):
        set_batch(net, *batch_of(4, seed=10 + s))
        net.forward_backward()
    f = capture.take(i)
    assert f.rows == 8
    wg, bg = np.empty_like(net.layers[i].blobs[0].diff), np.empty_like(net.layers[i].blobs[1].diff)
    sfb.rebuild(f, wg, bg)
    assert rel_err(wg, net.layers[i].blobs[0].diff) < 1e-5
    assert rel_err(bg, net.layers[i].blobs[1].diff) < 1e-5


def test_rebuild_sgd_step_equals_rebuild_then_the_sgd_update():
    """The fused tile path: SGD's step on U^T V without the M x N gradient, for tiles that do
    and do not divide the rows; equal to rebuild() + kernels' sgd_step on the whole gradient."""
    from minicaffe import backend

    be = backend.get()
    rng = np.random.default_rng(3)
    for rows_k, m, n, tile_rows in ((12, 7, 5, 3), (8, 10, 4, 10), (5, 9, 6, 4)):
        U = rng.standard_normal((rows_k, m)).astype(np.float32)
        V = rng.standard_normal((rows_k, n)).astype(np.float32)
        w0 = rng.standard_normal(m * n).astype(np.float32)
        h0 = rng.standard_normal(m * n).astype(np.float32)
        g = np.empty((m, n), np.float32)
        sfb.rebuild(sfb.SufficientFactors(U, V), g, gemm=be.gemm)
        w_ref, h_ref = w0.copy(), h0.copy()
        be.sgd_step(w_ref, g.reshape(-1), h_ref, 0.9, 0.01, 5e-4)
        w, h = w0.copy(), h0.copy()
        sfb.rebuild_sgd_step(U, V, w, h, 0.9, 0.01, 5e-4, be.gemm, be.sgd_step, np.empty((tile_rows, n), np.float32))
        np.testing.assert_allclose(w, w_ref, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-7)
    assert sfb.tile_for(4096, 9216, np.float32).shape == (56, 9216)  # 2 MiB of whole rows


def test_wfbp_auto_is_off_only_where_nodes_outnumber_cores(monkeypatch):
    from argparse import Namespace

    from minicaffe.dist.launch import wfbp_setting

    args = Namespace(wfbp="auto", workers=1)
    monkeypatch.setenv("MINICAFFE_LOCAL_NODES", "1")  # a machine per node
    assert wfbp_setting(args, 4) == (True, "auto")
    assert wfbp_setting(args, 1)[0] is False  # one node has nothing to overlap
    monkeypatch.setenv("MINICAFFE_LOCAL_NODES", "100000")  # every core already computing
    on, why = wfbp_setting(args, 4)
    assert not on and "nothing to overlap" in why
    assert wfbp_setting(Namespace(wfbp="on", workers=1), 4) == (True, "--wfbp on")  # as given, always
    assert wfbp_setting(Namespace(wfbp="off", workers=1), 4) == (False, "--wfbp off")


def test_the_launcher_plans_with_the_link_it_knows(monkeypatch):
    """The link rate the plan uses: --link, else the emulator's MINICAFFE_LINK_RATE, else None
    (10 Gbit/s assumed); --wfbp auto with the plan is cost.wfbp_auto on this machine's cores."""
    from argparse import Namespace

    from minicaffe.dist.launch import planning_link_rate, wfbp_setting
    from minicaffe.parallel import blas

    monkeypatch.delenv("MINICAFFE_LINK_RATE", raising=False)
    assert planning_link_rate(Namespace(link=None)) is None
    monkeypatch.setenv("MINICAFFE_LINK_RATE", "1gbit")
    assert planning_link_rate(Namespace(link=None)) == 1e9 / 8
    assert planning_link_rate(Namespace(link="10gbit")) == 10e9 / 8
    monkeypatch.setenv("MINICAFFE_LOCAL_NODES", "1")
    costs = cost.plan(lenet_net(), 2, comm="ps", global_batch=True)
    args = Namespace(wfbp="auto", workers=1, bucket_kb=None)
    got = wfbp_setting(args, 2, costs, 1e9 / 8)
    assert got == cost.wfbp_auto(costs, 2, 1, blas.cores(), link_rate=1e9 / 8) and got[1].startswith("auto: ")


def cifar10_quick_costs(k=25):
    """CIFAR-10 quick's layers with parameters, from shapes (K rows per node)."""
    lc = cost.layer_cost
    return [
        lc(1, "conv1", 2432),
        lc(4, "conv2", 25632),
        lc(7, "conv3", 51264),
        lc(10, "ip1", 65600, 64, 1024, k),
        lc(11, "ip2", 650, 10, 64, k),
    ]


def test_hybrid_keeps_the_byte_rule_where_sfb_pays_and_ps_where_it_does_not():
    """CIFAR-10 quick's ip1 on 4 nodes: the byte rule picks SFB (163,200 <= 196,608 floats), but
    SFB would cut the one gradient bucket in three (36 frames instead of 12) and add a rebuild
    for 134 KB fewer: the plan keeps PS and says why. LeNet's ip1 and the FC head stay SFB."""
    costs = cost.choose(cifar10_quick_costs(), 4)
    ip1 = {c.name: c for c in costs}["ip1"]
    assert ip1.rule_choice == "sfb" and ip1.choice == "ps" and "does not pay" in ip1.why
    assert ip1.floats == cost.ps_floats(65600, 1, 4, 4)
    units = cost.unit_times(costs, set(), 4)
    assert len(units) == 1 and units[0]["frames"] == 12  # one bucket: a GRAD and a PARAM per peer each way
    split = cost.unit_times(costs, {"ip1"}, 4)
    assert [u["method"] for u in split] == ["ps", "sfb", "ps"] and sum(u["frames"] for u in split) == 36
    assert sum(u["bytes"] for u in split) < units[0]["bytes"]  # fewer bytes, yet slower:
    assert sum(u["seconds"] for u in split) > units[0]["seconds"]
    # the byte rule alone (host=None), and --comm sfb, still send it by SFB
    assert {c.name: c.choice for c in cost.choose(cifar10_quick_costs(), 4, host=None)}["ip1"] == "sfb"
    assert {c.name: c.choice for c in cost.choose(cifar10_quick_costs(), 4, comm="sfb")}["ip1"] == "sfb"
    # a slow enough link makes the bytes worth it again
    slow = {c.name: c.choice for c in cost.choose(cifar10_quick_costs(), 4, link_rate=10e6 / 8)}
    assert slow["ip1"] == "sfb"
    net = lenet_net()  # LeNet's ip1: 4.3 MB fewer per node per iteration on 4 nodes pays
    plans = {c.name: c for c in cost.plan(net, 4, global_batch=True)}
    assert plans["ip1"].choice == plans["ip1"].rule_choice == "sfb" and "plan with SFB" in plans["ip1"].why
    head = [cost.layer_cost(i, f"fc{i}", m * n + m, m, n, 8) for i, (m, n) in enumerate([(4096, 9216), (4096, 4096)])]
    assert [c.choice for c in cost.choose(head, 4)] == ["sfb", "sfb"]
    text = cost.format_plan(costs, 4)
    assert "rule choice" in text and "does not pay" in text


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("gbit", [1, 10])
def test_cifar10_quick_runs_plain_ps_code_in_every_hybrid_mode_of_the_grid(nodes, gbit):
    """What the docs say of the grid's CIFAR-10 quick rows: in each of its four groups the hybrid
    plan sends every layer by PS in one gradient bucket, so WFBP starts nothing inside the
    backward (the runtime then runs plain PS's schedule) and --wfbp auto says off: every hybrid
    mode there is plain PS's code, and their ratios to PS are the spread of identical runs."""
    rate = gbit * 1e9 / 8
    costs = cost.choose(cifar10_quick_costs(k=100 // nodes), nodes, link_rate=rate)
    assert [c.choice for c in costs] == ["ps"] * len(costs)
    units = cost.sync_units(costs, set())
    assert len(units) == 1
    assert cost.starts_in_backward([[c.index for c in layers] for layers, _, _ in units]) == [False]
    assert cost.wfbp_gradient_slots(costs, 0) is None  # one gradient slot, as plain PS
    assert cost.wfbp_auto(costs, nodes, busy=nodes, cores=2, link_rate=rate)[0] is False


def test_the_plan_charges_the_threads_that_serve_the_syncs():
    """CIFAR-10 quick on 2 nodes at 1 Gbit/s (K = 50): the byte rule picks SFB for ip1 (108,800
    <= 131,072 floats), and an estimate of bytes, frames and the rebuild alone called that a near
    tie won by SFB (measured, the plan ran 3-5% slower than PS). The estimate now charges the
    thread that serves each unit (HostCosts.unit_cpu per unit, thread_cpu per serving thread: the
    SFB thread is a second one beside the shard's), as the simulator does: PS, and the start-up
    table says which term decided it."""
    import dataclasses

    rate = 1e9 / 8
    costs = cost.choose(cifar10_quick_costs(k=50), 2, link_rate=rate)
    ip1 = {c.name: c for c in costs}["ip1"]
    assert ip1.rule_choice == "sfb" and ip1.choice == "ps"
    assert "does not pay" in ip1.why and "serving threads +0.76 ms" in ip1.why
    host = cost.DEFAULT_HOST
    ps = cost.unit_times(costs, set(), 2, link_rate=rate)
    assert [u["serve_s"] for u in ps] == [pytest.approx(host.unit_cpu + host.thread_cpu)]
    split = cost.unit_times(costs, {"ip1"}, 2, link_rate=rate)
    assert [u["method"] for u in split] == ["ps", "sfb", "ps"]  # ip2's bucket, ip1, the convolutions
    assert sum(u["serve_s"] for u in split) == pytest.approx(3 * host.unit_cpu + 2 * host.thread_cpu)
    # without the serving threads' CPU (the old estimate) SFB won by 0.14 ms: the plan it ran
    old = dataclasses.replace(host, unit_cpu=0.0, thread_cpu=0.0)
    assert {c.name: c.choice for c in cost.choose(cifar10_quick_costs(k=50), 2, link_rate=rate, host=old)}[
        "ip1"
    ] == "sfb"
    text = cost.format_plan(costs, 2)
    assert "SFB  PS" in text and "serving threads" in text  # the rule's pick beside the plan's, and why
    # where SFB saves megabytes it still pays: LeNet's ip1 on 2 nodes at 1 Gbit/s
    lenet = {c.name: c for c in cost.plan(lenet_net(), 2, global_batch=True, link_rate=rate)}
    assert lenet["ip1"].choice == "sfb" and "serving threads +0.57 ms" in lenet["ip1"].why


def test_wfbp_auto_counts_the_serving_threads_cpu():
    """LeNet's hybrid plan on 2 nodes at 1 Gbit/s, a core per node: its syncs' CPU (bytes,
    frames, rebuild, and the serving threads' 1.33 ms) is more than the wire time WFBP could
    hide, so --wfbp auto is off (measured on that row: hybrid without WFBP 10.09 ms per
    iteration, with it 10.57). Without the serving threads' CPU it was on."""
    import dataclasses

    rate = 1e9 / 8
    old = dataclasses.replace(cost.DEFAULT_HOST, unit_cpu=0.0, thread_cpu=0.0)
    plan = cost.plan(lenet_net(), 2, global_batch=True, link_rate=rate)
    assert [c.name for c in plan if c.choice == "sfb"] == ["ip1"]
    on, why = cost.wfbp_auto(plan, 2, busy=2, cores=2, link_rate=rate)
    assert not on and "auto: off" in why
    assert cost.wfbp_auto(plan, 2, busy=2, cores=2, link_rate=rate, host=old)[0]


def test_wfbp_auto_weighs_the_overlap_against_the_syncs_cpu():
    """--wfbp auto: off with no core per compute thread; on where the hidden wire time is more
    than what the syncs cost (LeNet's parameter server at 1 Gbit/s on 2 nodes, each with a
    core); off where the syncs are CPU-bound (10 Gbit/s); on with spare cores."""
    net = lenet_net()
    ps = cost.plan(net, 2, comm="ps", global_batch=True)
    on, why = cost.wfbp_auto(ps, 2, busy=2, cores=2, link_rate=1e9 / 8)
    assert on and "auto: on" in why and "1 Gbit/s" in why
    on, why = cost.wfbp_auto(ps, 2, busy=2, cores=2, link_rate=10e9 / 8)
    assert not on and "auto: off" in why
    assert cost.wfbp_auto(ps, 2, busy=2, cores=16, link_rate=10e9 / 8)[0]  # a spare core per node
    on, why = cost.wfbp_auto(ps, 4, busy=4, cores=2, link_rate=1e9 / 8)
    assert not on and "nothing to overlap" in why
    assert cost.wfbp_auto(ps, 1, busy=1, cores=2) == (False, "auto: one node")


def test_bucket_flag_and_the_frame_bound():
    """--bucket-kb in bytes (default 1 MiB, negative refused clearly); a receiver's frame limit
    covers any bucket (at most the cap plus the largest layer, never more than the whole net)."""
    from argparse import Namespace

    from minicaffe.dist.launch import bucket_bytes
    from minicaffe.dist.ps import DEFAULT_BUCKET_BYTES, frame_bound
    from minicaffe.dist.transport import DistError

    assert bucket_bytes(Namespace()) == DEFAULT_BUCKET_BYTES == 1 << 20
    assert bucket_bytes(Namespace(bucket_kb=0)) == 0 and bucket_bytes(Namespace(bucket_kb=2.5)) == 2560
    with pytest.raises(DistError, match="--bucket-kb must be >= 0"):
        bucket_bytes(Namespace(bucket_kb=-1))
    net = lenet_net()
    total = sum(p.count for p in net.learnable_params) * 4  # 431,080 floats
    ip1 = (400_000 + 500) * 4
    assert frame_bound(net, 0) == ip1  # a bucket per blob: at most the largest layer
    assert frame_bound(net, 4096) == 4096 + ip1
    assert frame_bound(net, 1 << 30) == total


def test_host_costs_are_the_calibrations():
    """The runtime's per-unit costs (cost.HostCosts, constants so that every node plans alike)
    are what benchmarks/poseidon_calibration.json measured, within 5%: a new calibration that
    moves them fails here until the constants follow."""
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "poseidon_calibration.json")
    with open(path) as f:
        measured = cost.HostCosts.from_calibration(json.load(f))
    for name in ("cpu_per_byte", "cpu_per_frame", "wfbp_sync_cpu", "unit_cpu", "thread_cpu"):
        got, want = getattr(cost.DEFAULT_HOST, name), getattr(measured, name)
        assert got == pytest.approx(want, rel=0.05), f"HostCosts.{name} = {got:.3g}, the calibration says {want:.3g}"
