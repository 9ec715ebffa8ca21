"""The event model of python -m minicaffe.dist.simulate: known answers of the schedule, the FLOP
model against hand counts, the GPU plan and the command line."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minicaffe.dist import cost
from minicaffe.dist import simulate as sim
from minicaffe.errors import MinicaffeError

FREE = sim.Link(math.inf, 0.0)


def chain(*spec):
    """Layers from (forward, backward, count) tuples; FC when a 4th (m, n, k) is given."""
    out = []
    for j, s in enumerate(spec):
        lay = sim.Layer(f"l{j}", s[0], s[1], s[2])
        if len(s) > 3:
            lay.m, lay.n, lay.k = s[3]
        out.append(lay)
    return out


def test_units():
    assert sim.parse_rate("1gbit") == 125e6
    assert sim.parse_rate("10Gbit") == 1.25e9
    assert sim.parse_rate("100mbit") == 12.5e6
    assert sim.parse_seconds("0.1ms") == pytest.approx(1e-4)
    assert sim.parse_seconds("50us") == pytest.approx(5e-5)
    with pytest.raises(MinicaffeError, match="bandwidth 'fast'"):
        sim.parse_rate("fast")


@pytest.mark.parametrize("comm", cost.COMM_MODES)
@pytest.mark.parametrize("wfbp", [False, True])
def test_a_free_network_gives_linear_speedup(comm, wfbp):
    layers = chain((1e-3, 2e-3, 1000), (1e-3, 1e-3, 0), (2e-3, 4e-3, 5000, (50, 100, 8)))
    layers[2].wgrad = 0.0  # a free network and a free SFB rebuild: nothing but compute is left
    for p in (1, 2, 4, 32):
        s, r = sim.speedup(layers, p, FREE, comm, wfbp)
        assert s == pytest.approx(p), (comm, wfbp, p)
        assert r.period == pytest.approx(sum(l.forward + l.backward for l in layers))
        assert r.waiting == pytest.approx(0.0, abs=1e-12)


def test_sfb_rebuild_costs_p_weight_gradients():
    # over a free network SFB still rebuilds from P nodes' rows: P x the layer's dW GEMM (here
    # 2 ms), and the node skips its own dW (the rebuilt gradient replaces it)
    layers = chain((1e-3, 4e-3, 5000, (50, 100, 8)))
    for p in (2, 4):
        r = sim.simulate(layers, p, FREE, "sfb", wfbp=False)
        assert r.period == pytest.approx(5e-3 - 2e-3 + p * 2e-3)
    layers[0].sync_cpu = {"sfb": 1e-3}  # measured rebuild + update: used as it is
    assert sim.simulate(layers, 4, FREE, "sfb", wfbp=False).period == pytest.approx(3e-3 + 1e-3)


def test_nodes_sharing_cores():
    # 4 nodes on 2 cores: compute runs at half speed; the period is at least everyone's CPU / cores
    layers = chain((1e-3, 2e-3, 1000))
    host = sim.Host(cores=2)
    r = sim.simulate(layers, 4, FREE, "ps", wfbp=False, host=host)
    assert r.period == pytest.approx(2 * 3e-3)
    assert sim.simulate(layers, 2, FREE, "ps", wfbp=False, host=host).period == pytest.approx(3e-3)
    # moving bytes costs CPU: 1000 floats -> PS moves 2 x 1000 x 6/4 x 4 B = 12 kB per node
    link = sim.Link(1e12, 0.0)
    busy = sim.Host(cores=2, tcp_cpu=1e-6)  # 1 us per byte: 6 ms of CPU per node for its 6 kB each way
    r = sim.simulate(layers, 4, link, "ps", wfbp=True, host=busy)
    assert r.period == pytest.approx(4 * (3e-3 + 6e-3) / 2)  # bound by the cores, not the link


def test_one_layer_has_nothing_to_overlap():
    # one layer: its sync starts when the backward ends and the next forward needs it
    link = sim.Link(1e6, 1e-3)  # 1 MB/s, 1 ms
    layers = chain((0.010, 0.020, 25_000))
    for p in (2, 4):
        nbytes = cost.ps_floats(25_000, 1, p, p) * 4
        want = 0.030 + 2 * 1e-3 + nbytes / 2 / 1e6
        for wfbp in (False, True):
            r = sim.simulate(layers, p, link, "ps", wfbp)
            assert r.period == pytest.approx(want), (p, wfbp)
            assert r.bytes == pytest.approx(nbytes)


def test_wfbp_hides_the_top_layers_sync_behind_the_backward_below():
    # two layers: the top one's sync (10 ms) fits inside the bottom one's backward (20 ms)
    link = sim.Link(math.inf, 5e-3)  # only latency: PS costs 2 x 5 ms per layer
    layers = chain((0.001, 0.020, 10), (0.001, 0.001, 10))
    off = sim.simulate(layers, 2, link, "ps", wfbp=False)
    on = sim.simulate(layers, 2, link, "ps", wfbp=True)
    compute = 0.001 + 0.001 + 0.020 + 0.001
    assert off.period == pytest.approx(compute + 0.020)  # two syncs after the backward
    assert on.period == pytest.approx(compute + 0.010)  # only the bottom layer's sync shows
    assert on.waiting == pytest.approx(0.010 / on.period)


def test_sfb_and_ps_bytes_follow_the_cost_rule():
    layers = chain((1e-3, 1e-3, 500 * 800 + 500, (500, 800, 64)))
    for p in (2, 4, 16):
        ps = sim.simulate(layers, p, FREE, "ps").bytes
        sfb_ = sim.simulate(layers, p, FREE, "sfb").bytes
        hyb = sim.simulate(layers, p, FREE, "hybrid").bytes
        assert ps == pytest.approx(cost.ps_floats(500 * 800 + 500, 1, p, p) * 4)
        assert sfb_ == pytest.approx(cost.sfb_floats(64, 500, 800, p) * 4)
        assert hyb == min(ps, sfb_) or (p == 16 and hyb == ps)
    # the SFB rebuild is P times the layer's own weight-gradient GEMM, on the communication thread
    assert sim.sync_cost(layers[0], "sfb", 4, FREE)[1] == pytest.approx(4 * 0.5e-3)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(1e-5, 1e-2),
            st.floats(1e-5, 1e-2),
            st.integers(0, 200_000),
            st.booleans(),
            st.integers(1, 64),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 32),
    st.floats(1e6, 1e10),
    st.floats(0, 1e-3),
    st.sampled_from(cost.COMM_MODES),
)
def test_wfbp_is_never_slower(spec, nodes, bandwidth, latency, comm):
    layers = []
    for j, (f, b, count, fc, k) in enumerate(spec):
        lay = sim.Layer(f"l{j}", f, b, count, update=count * 1e-9)
        if fc and count:
            lay.m, lay.n, lay.k = 1, count, k
        layers.append(lay)
    link = sim.Link(bandwidth, latency)
    on = sim.simulate(layers, nodes, link, comm, True)
    off = sim.simulate(layers, nodes, link, comm, False)
    assert on.period <= off.period * (1 + 1e-9)
    assert on.period >= on.compute * (1 - 1e-9)  # never faster than the compute alone


def test_flop_model_counts_lenet_by_hand():
    rows = {r["name"]: r for r in sim.flops_model("nets/lenet.prototxt", 64)}
    # conv1: 20 maps of 24x24, each 1x5x5 taps, batch 64; conv2: 50 maps of 8x8, 20x5x5 taps
    assert rows["conv1"]["forward_flops"] == 2 * 64 * 20 * 24 * 24 * 25
    assert rows["conv2"]["forward_flops"] == 2 * 64 * 50 * 8 * 8 * 500
    assert (rows["ip1"]["m"], rows["ip1"]["n"], rows["ip1"]["k"]) == (500, 800, 64)
    assert rows["ip1"]["count"] == 500 * 800 + 500
    assert rows["ip1"]["backward_flops"] == 2 * rows["ip1"]["forward_flops"]
    assert sum(r["count"] for r in rows.values()) == 431_080  # LeNet's parameter count


def test_flop_model_of_the_planned_nets():
    alex = {r["name"]: r for r in sim.flops_model("nets/caffenet_deploy.prototxt", 1)}
    assert (alex["fc6"]["m"], alex["fc6"]["n"]) == (4096, 9216)
    assert sum(r["count"] for r in alex.values()) == 60_965_224  # CaffeNet's published count
    vgg = sim.flops_model("nets/vgg16_deploy.prototxt", 1)
    assert sum(r["count"] for r in vgg) == 138_357_544  # VGG-16's published count
    assert sum(r["forward_flops"] for r in vgg) == pytest.approx(30.94e9, rel=1e-3)  # 15.5 G multiply-adds


def test_plan_prints_both_nets_and_the_published_figures(tmp_path):
    lines = []
    png = tmp_path / "plan.png"
    panels = sim.plan(nodes_list=(1, 8, 16), png=str(png), out=lines.append)
    text = "\n".join(lines)
    assert "alexnet" in text and "vgg16" in text and "4.5x" in text and "15.5x" in text
    assert png.stat().st_size > 10_000
    for _, table in panels:
        for (comm, wfbp), rows in table.items():
            for p, s, r in rows:
                assert 0 < s <= p * 1.05, (comm, wfbp, p, s)  # the overlapped update may beat linear a little


def test_cli_with_a_times_file(tmp_path, capsys):
    times = tmp_path / "t.json"
    times.write_text(
        json.dumps(
            [
                {"name": "conv", "forward": 2.0, "backward": 4.0, "count": 5000},
                {"name": "fc", "forward": 1.0, "backward": 2.0, "count": 400_500, "m": 500, "n": 800, "k": 64},
            ]
        )
    )
    png, tl = tmp_path / "s.png", tmp_path / "tl.png"
    assert sim.main(["--times", str(times), "--nodes", "1", "2", "4", "--png", str(png), "--timeline", str(tl)]) == 0
    out = capsys.readouterr().out
    assert "hybrid+WFBP" in out and "1 Gbit/s" in out and "10 Gbit/s" in out
    assert png.exists() and tl.exists()
    assert sim.main(["--times", str(tmp_path / "missing.json")]) == 1
    assert "cannot read it" in capsys.readouterr().err
    assert sim.main([]) == 1


def test_cli_measures_a_net_and_saves_times_it_reads_back(tmp_path, capsys):
    """--measure times the net with python -m minicaffe.time's loop; --save-times writes what
    --times reads (to edit for another machine): the same layers give the same predictions."""
    saved = tmp_path / "lenet_times.json"
    args = ["--nodes", "1", "2", "4", "--bandwidth", "1gbit"]
    assert sim.main(["lenet", "--measure", "--synthetic", "--save-times", str(saved), *args]) == 0
    measured = capsys.readouterr().out
    rows = json.loads(saved.read_text())["layers"]
    by_name = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows][:2] == ["mnist", "conv1"] and "loss" in by_name
    assert (by_name["ip1"]["m"], by_name["ip1"]["n"], by_name["ip1"]["k"], by_name["ip1"]["count"]) == (
        500,
        800,
        64,
        400_500,
    )
    assert by_name["conv2"]["count"] == 25_050 and "m" not in by_name["conv2"]
    assert all(r["forward"] > 0 and r["backward"] >= 0 for r in rows)
    assert sim.main(["--times", str(saved), *args]) == 0
    again = capsys.readouterr().out
    table = lambda out: [line for line in out.splitlines() if not line.startswith("wrote")]
    assert table(again) == table(measured)
    assert "one node:" in again and "speedup over one node, 1 Gbit/s" in again
    assert sim.main(["--times", str(saved), "--save-times", str(tmp_path / "x.json")]) == 1
    assert "--save-times writes what --measure measured" in capsys.readouterr().err


def test_sync_units_are_the_runtimes_buckets():
    # layers: l0 PS (1000), l1 nothing, l2 PS (100), l3 SFB-able FC (5000), l4 PS (10)
    layers = chain((0, 0, 1000), (0, 0, 0), (0, 0, 100), (0, 0, 5000, (50, 100, 8)), (0, 0, 10))
    methods = [sim.method_of(l, 4, "hybrid") for l in layers]
    assert methods == ["ps", None, "ps", "sfb", "ps"]
    assert sim.sync_units(layers, methods, 0) == [[4], [3], [2], [0]]
    # a layer without parameters does not end a bucket; an SFB layer does
    assert sim.sync_units(layers, methods, 1 << 20) == [[4], [3], [0, 2]]
    assert sim.sync_units(layers, methods, 400) == [[4], [3], [2], [0]]  # l2's 400 B fill a bucket


def test_buckets_cut_frames_and_wfbp_costs_cpu_per_sync():
    # 4 nodes on 2 cores, bound by the cores: the period is P x (CPU per node) / cores
    layers = chain((1e-3, 1e-3, 10), (1e-3, 1e-3, 10), (1e-3, 1e-3, 10))
    link = sim.Link(1e12, 0.0)
    host = sim.Host(cores=2, frame_cpu=1e-4)  # 100 us per frame, both ends: 50 us per frame per node
    per_layer = sim.simulate(layers, 4, link, "ps", wfbp=False, host=host, bucket_bytes=0)
    one = sim.simulate(layers, 4, link, "ps", wfbp=False, host=host, bucket_bytes=1 << 20)
    frames = 4 * 3  # sent + received per unit: 3 peers, GRAD and PARAM each way
    cpu = 6e-3  # compute per node
    assert per_layer.period == pytest.approx(4 * (cpu + 3 * 2 * frames * 0.5e-4) / 2)  # 2 blobs per layer
    assert one.period == pytest.approx(4 * (cpu + frames * 0.5e-4) / 2)
    host.wfbp_sync_cpu = 1e-3
    on = sim.simulate(layers, 4, link, "ps", wfbp=True, host=host, bucket_bytes=0)
    # 3 units: the two that start inside the backward 1 ms more each; the lowest layer's starts
    # after the backward, synchronized as without WFBP, and costs nothing more (cost.starts_in_backward)
    assert on.period == pytest.approx(per_layer.period + 4 * 2 * 1e-3 / 2)
    assert on.cpu["wfbp"] == pytest.approx(2e-3)
    one_on = sim.simulate(layers, 4, link, "ps", wfbp=True, host=host, bucket_bytes=1 << 20)
    assert one_on.period == pytest.approx(one.period) and one_on.cpu["wfbp"] == 0.0  # one unit: nothing
    assert sim.simulate(layers, 4, link, "ps", wfbp=False, host=host, bucket_bytes=0).period == per_layer.period


def test_a_transport_limiter_costs_its_sender_cpu_per_frame_sent():
    host = sim.Host(cores=2, tcp_cpu=1e-9, frame_cpu=1e-4, limiter_frame_cpu=3e-4)
    # 1 MB sent + received in 24 frames (12 sent): bytes half each end, frames half each end,
    # the limiter on the 12 frames this node sends
    assert host.transport_cpu(1e6, 24) == pytest.approx(0.5e-3 + 12 * 1e-4 + 12 * 3e-4)


def test_the_kernels_work_outside_the_nodes_is_charged_per_byte():
    # 1 MB sent + received: half the transport's per-byte cost is this node's, and all of the
    # kernel's work outside the node processes for the bytes it moves
    host = sim.Host(cores=2, tcp_cpu=1e-9, outside_cpu_per_byte=0.05e-9)
    assert host.transport_cpu(1e6, 0) == pytest.approx(0.5e-3 + 0.05e-3)
    # 4 nodes on 2 cores, CPU-bound: 3 MB per node (PS: 2 x 250,000 floats x 6/4) cost each node
    # 150 us more CPU, and the four of them on two cores 300 us more per iteration
    layers = chain((1e-3, 1e-3, 250_000))
    plain = sim.simulate(layers, 4, FREE, "ps", wfbp=False, host=sim.Host(cores=2, tcp_cpu=1e-9), bucket_bytes=1 << 20)
    more = sim.simulate(layers, 4, FREE, "ps", wfbp=False, host=host, bucket_bytes=1 << 20)
    assert plain.bytes == more.bytes == pytest.approx(3e6)
    assert more.cpu["transport"] - plain.cpu["transport"] == pytest.approx(150e-6)
    assert more.period - plain.period == pytest.approx(300e-6)


def test_the_outside_cost_comes_from_the_byte_runs_periods():
    bench = _bench()
    # 4 nodes on 2 cores: 2 x 0.70 s of the cores per iteration, the nodes' own CPU 4 x 0.31 s,
    # 0.16 s outside them for 4 x 700 MB
    tries = [{"period_s": p, "cpu_s": 0.31, "bytes": 700e6} for p in (0.70, 0.68, 0.74)]
    calib = {"cores": 2, "byte_run": {"path": "veth + bridge + tc", "tries": tries}}
    assert bench.outside_per_byte(calib) == pytest.approx((2 * 0.70 - 4 * 0.31) / (4 * 700e6))
    assert bench.outside_per_byte({"cores": 2, "byte_run": {"path": "loopback", "tries": tries}}) == 0.0
    assert bench.outside_per_byte({"cores": 2}) == 0.0


def test_a_sync_overlapping_the_backward_shares_the_nodes_core():
    # 2 nodes on 2 cores: a node owns one core. With WFBP the top layer's sync (4 ms of CPU)
    # runs during the bottom layer's backward (10 ms): both lanes at half a core until the sync
    # is done (8 ms), then the backward alone: the period is all the CPU, 1 + 1 + 10 + 4 ms
    layers = chain((1e-3, 10e-3, 0), (1e-3, 0.0, 10))
    layers[1].sync_cpu = {"ps": 4e-3}
    r = sim.simulate(layers, 2, FREE, "ps", wfbp=True, host=sim.Host(cores=2))
    assert r.period == pytest.approx(16e-3)
    syncs = [e for e in r.events if e[0] == "comm"]
    assert [e[3] - e[2] for e in syncs] == pytest.approx([8e-3] * len(syncs))  # at half a core
    # with two cores per node the sync hides behind the backward
    assert sim.simulate(layers, 2, FREE, "ps", wfbp=True, host=sim.Host(cores=4)).period == pytest.approx(12e-3)
    # 4 nodes on 2 cores: half a core per node, the same work takes twice as long
    assert sim.simulate(layers, 4, FREE, "ps", wfbp=True, host=sim.Host(cores=2)).period == pytest.approx(32e-3)


def test_a_lane_waiting_for_the_wire_leaves_the_cores_idle():
    # one layer, no WFBP: compute 2 ms, then its PS sync: two round trips of 5 ms one way on the
    # wire while the transport's 3 ms of CPU move the bytes; the cores idle for the rest
    layers = chain((1e-3, 1e-3, 1000))
    link = sim.Link(math.inf, 5e-3)
    host = sim.Host(cores=2, frame_cpu=2 * 3e-3 / 4)  # 4 frames sent + received: 3 ms per node
    r = sim.simulate(layers, 2, link, "ps", wfbp=False, host=host, bucket_bytes=1 << 20)
    assert r.cpu["transport"] == pytest.approx(3e-3)
    assert r.period == pytest.approx(2e-3 + 10e-3)  # not the CPU bound, 5 ms
    slow = sim.Host(cores=2, frame_cpu=2 * 30e-3 / 4)  # now the CPU outlasts the wire
    assert sim.simulate(layers, 2, link, "ps", False, host=slow, bucket_bytes=1 << 20).period == pytest.approx(32e-3)


def test_contention_per_node_count():
    assert sim.Host(cores=2, contention=1.2).inflation(2) == 1.0  # a number: only past the cores
    assert sim.Host(cores=2, contention=1.2).inflation(4) == 1.2
    host = sim.Host(cores=2, contention={2: 1.05, 4: 1.1})  # measured at 2 and 4 nodes: the nearest
    assert [host.inflation(p) for p in (1, 2, 3, 4, 32)] == [1.0, 1.05, 1.1, 1.1, 1.1]
    layers = chain((1e-3, 2e-3, 0))
    assert sim.simulate(layers, 2, FREE, "ps", host=host).period == pytest.approx(1.05 * 3e-3)
    # the sync's kernels (here a PS update of 1 ms) slow as the compute's: 2 nodes, 2 cores each
    layers = chain((1e-3, 2e-3, 10))
    layers[0].sync_cpu = {"ps": 1e-3}
    wide = sim.Host(cores=4, contention={2: 1.05})
    r = sim.simulate(layers, 2, FREE, "ps", wfbp=False, host=wide)
    assert r.cpu["sync"] == pytest.approx(1.05e-3)
    assert r.period == pytest.approx(1.05 * (3e-3 + 1e-3))


def test_an_sfb_rebuild_slows_by_the_sfb_threads_own_factor():
    # hybrid on 2 nodes, 4 cores: conv (PS, a 1 ms update) and ip (SFB, a 10 ms rebuild)
    layers = chain((1e-3, 1e-3, 1000), (1e-3, 1e-3, 5000, (50, 100, 2)))
    layers[0].sync_cpu, layers[1].sync_cpu = {"ps": 1e-3}, {"sfb": 10e-3}
    same = sim.Host(cores=4, contention={2: 1.1})
    apart = sim.Host(cores=4, contention={2: 1.1}, sfb_contention={2: 1.3})
    assert same.sfb_inflation(2) == pytest.approx(1.1)  # not measured apart: the compute's
    assert apart.sfb_inflation(2) == pytest.approx(1.3)
    assert apart.sfb_inflation(1) == 1.0
    r = {k: sim.simulate(layers, 2, FREE, "hybrid", wfbp=False, host=h) for k, h in (("same", same), ("apart", apart))}
    assert r["same"].cpu["sync"] == pytest.approx(1.1 * 11e-3)
    assert r["apart"].cpu["sync"] == pytest.approx(1.1 * 1e-3 + 1.3 * 10e-3)  # the shard's update as the compute
    assert r["apart"].cpu["compute"] == pytest.approx(r["same"].cpu["compute"])
    assert r["apart"].period - r["same"].period == pytest.approx(0.2 * 10e-3)
    # measured apart, the factor is the SFB thread's whole CPU's: its units' and its own too
    costs = dict(cores=4, unit_cpu=1e-4, thread_cpu=2e-4)
    r = sim.simulate(layers, 2, FREE, "hybrid", wfbp=False, host=sim.Host(**costs, sfb_contention={2: 1.3}))
    assert r.cpu["sync"] == pytest.approx(1e-3 + 3e-4 + 1.3 * (10e-3 + 3e-4))
    r = sim.simulate(layers, 2, FREE, "hybrid", wfbp=False, host=sim.Host(**costs))
    assert r.cpu["sync"] == pytest.approx(11e-3 + 2 * 3e-4)


def test_serving_threads_and_the_process_cost_cpu():
    # hybrid on 2 nodes: ip (SFB) and conv (PS) each a unit; each serving thread (the shard's,
    # the SFB thread) costs thread_cpu once an iteration, each unit unit_cpu; the rest of the
    # process iteration_cpu on the compute lane
    layers = chain((1e-3, 1e-3, 1000), (1e-3, 1e-3, 5000, (50, 100, 2)))
    assert [sim.method_of(l, 2, "hybrid") for l in layers] == ["ps", "sfb"]
    layers[0].sync_cpu, layers[1].sync_cpu = {"ps": 0.0}, {"sfb": 0.0}
    host = sim.Host(cores=4, unit_cpu=1e-4, thread_cpu=2e-4, iteration_cpu=1e-3)
    r = sim.simulate(layers, 2, FREE, "hybrid", wfbp=False, host=host, bucket_bytes=1 << 20)
    assert r.cpu["sync"] == pytest.approx(2 * 1e-4 + 2 * 2e-4)
    assert r.cpu["process"] == pytest.approx(1e-3)
    # the SFB layer skips its own dW (half its backward): 3.5 ms compute + 1 ms process, then
    # the two syncs' 0.6 ms one after the other (nothing overlaps without WFBP)
    assert r.period == pytest.approx(3.5e-3 + 1e-3 + 0.6e-3)


def _bench():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "poseidon.py")
    spec = importlib.util.spec_from_file_location("poseidon_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_costs_from_training_runs_are_solved_from_their_differences():
    bench = _bench()
    # runs made of known costs: a frame 100 us (both ends), the process 1 ms, a unit 50 us and a
    # serving thread 200 us beyond the shard's kernels (120 us), 0.5 ns per byte on loopback
    frame, fixed, unit, thread, kernel, per_byte, nbytes = 100e-6, 1e-3, 50e-6, 200e-6, 120e-6, 0.5e-9, 5e6

    def run(units, compute=5e-3, extra=0.0, cpu=11e-3):
        return {
            "transport_cpu_s": fixed + nbytes / 2 * per_byte + 12 * units / 2 * frame + extra,
            "server_cpu_s": kernel + thread + units * unit,
            "compute_cpu_s": compute,
            "cpu_s": cpu,
            "bytes": nbytes,
            "period_s": 25e-3,  # on 2 cores: 4 nodes' 11 ms would take 22, 2 nodes' 11
        }

    med = {"off": run(4), "one": run(1), "on": run(4, cpu=12e-3), "limiter": run(4, extra=24 * 80e-6)}
    med["two"] = run(4, compute=9.2e-3)
    got = bench.solve_run_costs(med, per_byte, {2: 10e-3, 4: 4.5e-3}, kernel, cores=2)
    assert got["drift_s"] == pytest.approx({"2": 14e-3, "4": 3e-3})  # the cores idle at the barrier
    # the period the grid reports, the median iteration, where a run kept it (not the marks' mean)
    med["two"] = dict(med["two"], period_median_s=20e-3)
    assert bench.solve_run_costs(med, per_byte, {2: 10e-3, 4: 4.5e-3}, kernel, cores=2)["drift_s"]["2"] == (
        pytest.approx(9e-3)
    )
    assert got["cpu_s_per_frame"] == pytest.approx(frame)
    assert got["iteration_cpu_s"] == pytest.approx(fixed)
    assert got["unit_cpu_s"] == pytest.approx(unit)
    assert got["thread_cpu_s"] == pytest.approx(thread)
    assert got["wfbp_cpu_s_per_sync"] == pytest.approx(1e-3 / 4)
    assert got["limiter_cpu_s_per_frame"] == pytest.approx(80e-6)
    assert got["contention_measured"] == pytest.approx({"2": 0.92, "4": 5 / 4.5})
    assert got["contention"] == pytest.approx({"2": 1.0, "4": 5 / 4.5})  # never below alone
    # the simulator takes each cost's median over the calibration calls kept
    calls = [dict(got, unit_cpu_s=u, contention={"4": c}) for u, c in ((1e-5, 1.2), (3e-5, 1.0), (2e-5, 1.1))]
    costs = bench.run_costs_of({"run_calls": calls})
    assert costs["unit_cpu_s"] == pytest.approx(2e-5)
    assert costs["contention"] == pytest.approx({"4": 1.1})


def test_the_simulator_plans_with_the_runtimes_rule():
    # CIFAR-10 quick's geometry on 4 nodes: the byte rule sends ip1 (64 x 1024, K = 25) by SFB;
    # the runtime's rule (cost.choose with its host costs) keeps it on the parameter server,
    # where it shares the convolutions' bucket, and the simulator plans the same
    layers = [
        sim.Layer("conv", 1e-3, 2e-3, 79_328),
        sim.Layer("ip1", 1e-4, 2e-4, 65_600, 64, 1024, 25),
        sim.Layer("ip2", 1e-5, 2e-5, 650, 10, 64, 25),
    ]
    link = sim.Link(sim.parse_rate("1gbit"), 1e-4)
    assert sim.choose_methods(layers, 4) == [sim.method_of(l, 4, "hybrid") for l in layers] == ["ps", "sfb", "ps"]
    ran = sim.simulate(layers, 4, link, "hybrid", bucket_bytes=1 << 20)
    assert ran.methods == {"conv": "ps", "ip1": "sfb", "ip2": "ps"}
    now = sim.simulate(layers, 4, link, "hybrid", bucket_bytes=1 << 20, rule_host=cost.DEFAULT_HOST)
    assert now.methods == {"conv": "ps", "ip1": "ps", "ip2": "ps"}
    costs = cost.choose(
        [cost.layer_cost(i, l.name, l.count, l.m, l.n, l.k) for i, l in enumerate(layers)],
        4,
        bucket_bytes=1 << 20,
        link_rate=link.bandwidth,
    )
    assert {c.name: c.choice for c in costs} == now.methods
    # a recorded run's own choice, to time it as it ran
    forced = sim.simulate(layers, 4, link, "hybrid", bucket_bytes=1 << 20, rule_host=cost.DEFAULT_HOST, sfb={"ip1"})
    assert forced.methods == ran.methods
    assert forced.period == pytest.approx(ran.period)


def test_a_calibrated_net_is_the_median_of_its_calls():
    bench = _bench()

    def call(f, sync):
        layer = {"name": "ip1", "forward": f, "backward": 2 * f, "count": 10, "m": 2, "sync_cpu": {"ps": sync}}
        return {"net": "lenet", "nodes": 4, "per_node_batch": 16, "overhead": f / 10, "layers": [layer]}

    calls = [call(1.0, 5.0) | {"commit": "a1"}, call(3.0, 4.0) | {"commit": "b2"}, call(2.0, 6.0)]
    got = bench.median_net(calls)
    assert got["commits"] == ["a1", "b2"]  # the code each call measured, never a median of them
    assert bench.calibration_code({"net_calls": {"lenet|4": calls}, "byte_run": {"commit": "c3"}}) == ["a1", "b2", "c3"]
    assert got["overhead"] == pytest.approx(0.2)
    assert got["per_node_batch"] == 16 and isinstance(got["per_node_batch"], int)
    lay = got["layers"][0]
    assert (lay["name"], lay["forward"], lay["backward"], lay["count"]) == ("ip1", 2.0, 4.0, 10)
    assert lay["sync_cpu"] == {"ps": 5.0}


def test_an_sfb_rebuild_is_timed_at_every_node_count_of_the_same_batch():
    # the rebuild + update of an SFB layer works on the whole batch's rows (P x K) whatever P
    # is: the simulator takes the median of every call at every node count of that batch
    bench = _bench()

    def call(nodes, sfb, batch=32):
        layer = {"name": "ip", "forward": 1e-3, "backward": 2e-3, "count": 5050, "blobs": 2}
        layer.update(m=50, n=100, k=batch // nodes, update=1e-5, wgrad=1e-3, sync_cpu={"ps": 1e-4, "sfb": sfb})
        return {"net": "fc", "nodes": nodes, "global_batch": batch, "per_node_batch": batch // nodes,
                "overhead": 0.0, "layers": [layer]}  # fmt: skip

    calls = {"fc|2": [call(2, 5e-3), call(2, 7e-3)], "fc|4": [call(4, 6.5e-3), call(4, 8e-3)]}
    calls["fc|8"] = [call(8, 50e-3, batch=64)]  # another batch: other rows, other work
    calls["other|2"] = [dict(call(2, 90e-3), net="other")]
    calib = {"net_calls": calls}
    assert bench.sfb_sync_cpu(calib, "fc", 32) == {"ip": pytest.approx(6.75e-3)}
    calib |= {"cores": 4, "nets": {"fc|2": bench.median_net(calls["fc|2"])}}
    calib["tcp"] = {"cpu_s_per_byte": 0.0, "cpu_s_per_frame": 0.0, "round_trip_s": 0.0}
    r = bench.predicted(calib, "fc", 2, "10gbit", "sfb", "off", "star", "0", sfb={"ip"})
    assert r.methods == {"ip": "sfb"}
    assert r.cpu["sync"] == pytest.approx(6.75e-3)  # not the 2-node calls' own median, 6 ms


def test_a_grid_rerun_in_part_is_validated_by_part():
    bench = _bench()
    earlier = {"a": {"seconds_per_iter": 1.0}, "b": {"seconds_per_iter": 2.0}}
    now = {"a": {"seconds_per_iter": 1.0}, "b": {"seconds_per_iter": 2.5}, "c": {"seconds_per_iter": 3.0}}
    assert bench.measured_since(now, earlier) == {"b", "c"}
    now = {k: dict(r, predicted_s=r["seconds_per_iter"]) for k, r in now.items()}
    now = {f"lenet|2|1gbit|{k}|off": r for k, r in now.items()}
    assert "within 15%: 3 of 3" in bench.validation(now)
    assert "within 15%: 1 of 1" in bench.validation(now, only={"lenet|2|1gbit|c|off"})


class _FakeGit:
    """A history a -> b -> c -> d (each commit's parent the one before), and a branch a -> x."""

    parents = {"a": None, "b": "a", "c": "b", "d": "c", "x": "a"}

    def known(self, commit):
        return commit in self.parents

    def _line(self, commit):
        out = []
        while commit is not None:
            out.append(commit)
            commit = self.parents[commit]
        return out

    def is_ancestor(self, a, b):
        return a in self._line(b)

    def distance(self, a, b):
        return len(set(self._line(b)) - set(self._line(a)))

    def head(self):
        return "d"


def test_each_run_is_checked_against_the_calibration_of_its_own_code():
    bench = _bench()
    git = _FakeGit()
    calibs = {
        "old.json": {"code_commit": "a"},  # made before its calls recorded their commit
        "mid.json": {"net_calls": {"lenet|2": [{"commit": "b+"}, {"commit": "b"}]}},
        "new.json": {"run_calls": [{"commit": "c"}], "byte_run": {"commit": "d+"}},  # the oldest of its codes
        "lost.json": {"code_commit": "zzz"},  # a commit this checkout does not have
    }
    assert [bench.calibration_commit(c, git) for c in calibs.values()] == ["a", "b", "c", None]
    results = {
        "r1": {"seconds_per_iter": 1.0},  # landed in b, unchanged since: b's code measured it
        "r2": {"seconds_per_iter": 2.5},  # measured again, landed in d
        "r3": {"seconds_per_iter": 3.0, "code_commit": "b+"},  # its own record wins
        "r4": {"seconds_per_iter": 4.0, "code_commit": "x"},  # a branch from a: only a is in its history
        "r5": {"seconds_per_iter": 5.0},  # not committed: the checkout's code
        "r6": {"seconds_per_iter": 6.0, "code_commit": "gone"},  # rebased away: where it landed
    }
    history = [  # newest first
        ("d", {"r1": {"seconds_per_iter": 1.0}, "r2": {"seconds_per_iter": 2.5}, "r6": {"seconds_per_iter": 6.0}}),
        ("c", {"r1": {"seconds_per_iter": 1.0}, "r2": {"seconds_per_iter": 2.0}, "r6": {"seconds_per_iter": 6.0}}),
        ("b", {"r1": {"seconds_per_iter": 1.0}, "r2": {"seconds_per_iter": 2.0}}),
        ("a", {"r1": {"seconds_per_iter": 0.9}}),
    ]
    assert bench.landed_at(results, history) == {"r1": "b", "r2": "d", "r3": None, "r4": None, "r5": None, "r6": "c"}
    got = bench.own_calibrations(results, calibs, git, history)
    assert got == {
        "r1": ("mid.json", "b"),
        "r2": ("new.json", "d"),
        "r3": ("mid.json", "b"),
        "r4": ("old.json", "x"),
        "r5": ("new.json", "d"),
        "r6": ("new.json", "c"),
    }
    # code older than every calibration: no like-for-like check
    assert bench.own_calibrations(
        {"r": {"seconds_per_iter": 1.0}},
        {"mid.json": calibs["mid.json"]},
        git,
        [("a", {"r": {"seconds_per_iter": 1.0}})],
    ) == {"r": (None, "a")}


def test_nodes_out_of_step_idle_the_cores_at_the_barrier():
    # two nodes on one core each, CPU-bound: the period is the node's CPU; a drift of 1 ms at
    # BSP's barrier adds 1 ms with or without WFBP (with it, the last sync waits for the
    # slowest node's gradients too, its CPU held with the compute's)
    layers = [sim.Layer("a", 1e-3, 2e-3, 1000), sim.Layer("b", 1e-3, 2e-3, 1000)]
    layers[0].sync_cpu = layers[1].sync_cpu = {"ps": 0.5e-3}
    for wfbp in (False, True):
        got = {}
        for drift in (0.0, 1e-3, {2: 1e-3, 4: 5e-3}):
            host = sim.Host(cores=2, drift=drift)
            got[str(drift)] = sim.simulate(layers, 2, FREE, "ps", wfbp=wfbp, host=host).period
        assert got["0.001"] == pytest.approx(got["0.0"] + 1e-3)
        assert got[str({2: 1e-3, 4: 5e-3})] == pytest.approx(got["0.001"])  # the nearest node count's
    assert sim.Host(cores=2, drift=1e-3).drift_at(1) == 0.0  # one node waits for nobody


def test_only_a_ps_layers_gradient_is_zeroed_before_the_backward():
    layers = [
        sim.Layer("conv", 1e-3, 2e-3, 1000, zero=0.4e-3),
        sim.Layer("ip", 1e-3, 2e-3, 1000, 10, 100, 4, zero=0.6e-3),
    ]
    host = sim.Host(cores=4)
    ps = sim.simulate(layers, 2, FREE, "ps", wfbp=False, host=host)
    sfb = sim.simulate(layers, 2, FREE, "ps", wfbp=False, host=host, sfb={"ip"})
    assert ps.cpu["compute"] == pytest.approx(6e-3 + 1e-3)
    assert sfb.cpu["compute"] == pytest.approx(6e-3 - 1e-3 + 0.4e-3)  # (and the SFB layer skips its dW)


def test_a_nets_contention_is_its_own_training_runs_compute_over_alone():
    bench = _bench()
    lenet = {"layers": [{"name": "ip", "forward": 3e-3, "backward": 6e-3, "count": 100}], "overhead": 1e-3}
    fc = {"layers": [{"name": "fc", "forward": 4e-3, "backward": 8e-3, "wgrad": 3e-3, "count": 1000}], "overhead": 0.0}
    calib = {
        "nets": {"lenet|2": lenet, "lenet|4": dict(lenet, overhead=0.0), "fc|2": dict(fc, zero_s_per_param=1e-6)},
        # the runs' compute: 10.505 and 9.9 ms on 2 nodes (11 ms alone and 10 in those calls)
        "run_calls": [
            {"contention": {"2": 1.0, "4": 1.2}, "contention_measured": {"2": 0.955, "4": 1.2},
             "compute_alone_s": {"2": 11e-3, "4": 10e-3}},
            {"contention": {"2": 1.0, "4": 1.1}, "contention_measured": {"2": 0.99, "4": 1.1},
             "compute_alone_s": {"2": 10e-3, "4": 10e-3}},
        ],  # fmt: skip
        # the FC net's runs, its layer by SFB (no dW, nothing zeroed: 9 ms alone), then by PS (13 ms)
        "net_runs": {"fc|2": [{"compute_cpu_s": [9.9e-3, 10.8e-3, 9.0e-3], "sfb": ["fc"]},
                              {"compute_cpu_s": [14.3e-3], "sfb": []}]},
    }  # fmt: skip
    runs = bench.runs_contention(calib)
    # the median of the runs' compute over LeNet alone in the nets' timings (10 ms): below 1 is kept
    assert runs == {2: pytest.approx(10.2025e-3 / 10e-3), 4: pytest.approx(11.5e-3 / 9e-3)}
    assert bench.compute_alone(calib["nets"]["fc|2"], {"fc"}) == pytest.approx(9e-3)
    assert bench.compute_alone(calib["nets"]["fc|2"]) == pytest.approx(13e-3)
    got = bench.net_contention(calib, "fc")
    assert got[2] == pytest.approx(1.1)  # the median of 1.1, 1.2, 1.0 and 1.1
    assert got[4] == pytest.approx(runs[4])  # not measured on 4 nodes: LeNet's
    assert bench.net_contention(calib, "lenet") == runs


def test_a_nets_sfb_thread_and_out_of_step_time_come_from_its_own_runs():
    bench = _bench()
    fc = {
        "net": "fc",
        "global_batch": 32,
        "overhead": 0.0,
        "layers": [{"name": "fc", "forward": 4e-3, "backward": 8e-3, "count": 1000, "sync_cpu": {"sfb": 20e-3}}],
    }
    calib = {
        "cores": 2,
        "nets": {"fc|2": fc, "fc|4": dict(fc, global_batch=32)},
        "net_calls": {"fc|2": [fc], "fc|4": [dict(fc, layers=[dict(fc["layers"][0], sync_cpu={"sfb": 22e-3})])]},
        # LeNet's runs: a sync unit 1 ms and the serving thread 0.5 ms beyond its kernels; out of step
        "run_calls": [{"unit_cpu_s": 1e-3, "thread_cpu_s": 0.5e-3, "contention": {"2": 1.0},
                       "drift_s": {"2": 1e-3, "4": 2e-3}}],
        # the FC net's runs on 2 nodes: the SFB thread 21.5 x (1.2, 1.4, 1.0) ms, 2 nodes' 150 ms of
        # CPU on 2 cores in periods of 154, 160 and 151 ms (a run from before they were kept: none)
        "net_runs": {"fc|2": [{"compute_cpu_s": [9e-3] * 3, "sfb": ["fc"], "sfb_cpu_s": [25.8e-3, 30.1e-3, 21.5e-3],
                               "cpu_s": [150e-3] * 3, "period_median_s": [154e-3, 160e-3, 151e-3]},
                              {"compute_cpu_s": [9e-3], "sfb": ["fc"]}]},
    }  # fmt: skip
    # the rebuild alone: the median over every call of the same global batch (20 and 22 ms)
    assert bench.sfb_alone(calib, fc, ["fc"]) == pytest.approx(21e-3 + 1e-3 + 0.5e-3)
    assert bench.sfb_alone(calib, fc, []) == 0.0
    got = bench.net_sfb_contention(calib, "fc")
    assert got == {2: pytest.approx(25.8e-3 / 22.5e-3)}  # the median run's; 4 nodes not measured
    assert bench.net_sfb_contention(calib, "lenet") == {}
    assert bench.net_drift(calib, "fc") == {2: pytest.approx(4e-3), 4: pytest.approx(2e-3)}  # 4: LeNet's
    assert bench.net_drift(calib, "lenet") == {2: pytest.approx(1e-3), 4: pytest.approx(2e-3)}
