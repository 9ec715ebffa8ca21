"""python -m minicaffe.time --save-times: the per-layer times the Poseidon simulator reads.

The time tool measures each layer's forward and backward; with --save-times it writes them in
the file format ``python -m minicaffe.dist.simulate --times`` reads.  The round trip is checked
end to end: the medians the tool prints are the ones in the file, and the simulator reads the
same per-layer times (and the geometry of the layers it syncs) back.
"""

import json
import re

import pytest

from minicaffe.dist import simulate as sim
from minicaffe.tools import timing

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 1 dim: 8 dim: 8 } shape { dim: 8 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

ROW = re.compile(r"\s(\S+) (\S+)\s+forward:\s+([\d.]+) ms\s+backward:\s+([\d.]+) ms")


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "tiny.prototxt"
    path.write_text(NET)
    return str(path)


def test_time_tool_writes_what_the_simulator_reads(net_file, tmp_path, capsys):
    saved = tmp_path / "times.json"
    args = [net_file, "--iterations", "3", "--warmup", "1", "--lanes", "1", "--no-roofline"]
    assert timing.main([*args, "--save-times", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"Wrote the per-layer times to {saved}" in out
    printed = {m[1]: (float(m[3]), float(m[4])) for m in map(ROW.search, out.splitlines()) if m}
    assert list(printed) == ["data", "conv", "relu", "ip", "loss"]

    rows = json.loads(saved.read_text())["layers"]
    assert [r["name"] for r in rows] == list(printed)
    by_name = {r["name"]: r for r in rows}
    # the layers the simulator syncs: parameter counts; the FC layer: its M x N weight, K = the batch a node runs
    assert by_name["conv"]["count"] == 4 * 9 + 4 and "m" not in by_name["conv"]
    assert by_name["ip"]["count"] == 10 * 4 * 6 * 6 + 10
    assert (by_name["ip"]["m"], by_name["ip"]["n"], by_name["ip"]["k"]) == (10, 144, 8)
    assert by_name["ip"]["update"] > 0 and "count" not in by_name["relu"]

    layers = sim.layers_from_json(str(saved))  # what --times reads
    assert [lay.name for lay in layers] == list(printed)
    for lay in layers:  # the printed medians (3 decimals of a ms) are the file's
        assert lay.forward * 1e3 == pytest.approx(printed[lay.name][0], abs=6e-4), lay.name
        assert lay.backward * 1e3 == pytest.approx(printed[lay.name][1], abs=6e-4), lay.name
    assert sum(lay.forward + lay.backward for lay in layers) > 0
    assert sim.main(["--times", str(saved), "--nodes", "1", "2", "--bandwidth", "1gbit"]) == 0
    table = capsys.readouterr().out
    assert f"{len(layers)} layers" in table and "speedup over one node, 1 Gbit/s" in table


def test_save_times_needs_the_train_phase_and_a_writable_file(net_file, tmp_path, capsys):
    args = [net_file, "--iterations", "1", "--warmup", "0", "--lanes", "1", "--no-roofline"]
    assert timing.main([*args, "--phase", "TEST", "--save-times", str(tmp_path / "t.json")]) == 1
    assert "--save-times needs --phase TRAIN" in capsys.readouterr().err
    missing = tmp_path / "no_such_dir" / "t.json"
    assert timing.main([*args, "--save-times", str(missing)]) == 1
    assert f"--save-times {missing}: cannot write it" in capsys.readouterr().err
