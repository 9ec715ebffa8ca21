"""benchmarks/lenet_vs_pytorch.py's Caffe rows: the net it hands ``caffe time`` (the TRAIN net
with an Input layer for the Data layers) and how it reads Caffe's log.  No Caffe binary is
installed here, so a stand-in script plays ``caffe``: it checks the command line it gets and
prints the lines BVLC Caffe's ``caffe time`` prints."""

import os
import sys

import pytest

import minicaffe as caffe
from minicaffe import proto
from minicaffe.parallel import with_synthetic_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import lenet_vs_pytorch as bench  # noqa: E402


@pytest.mark.parametrize("net, shape", [("lenet", (64, 1, 28, 28)), ("cifar10_quick", (100, 3, 32, 32))])
def test_caffe_time_model_is_the_train_net_fed_by_an_input_layer(tmp_path, net, shape):
    path = tmp_path / "m.prototxt"
    bench.caffe_time_model(net, str(path))
    timed = caffe.Net(str(path), caffe.TRAIN)
    param, _ = bench.load_solver_param_for(net)
    netp = with_synthetic_data(proto.parse_file(os.path.join(ROOT, "nets", param.net), "NetParameter"), count=200)
    full = caffe.Net(netp, caffe.TRAIN)
    assert timed.layers[0].type == "Input" and timed.blobs["data"].shape == shape
    assert timed.blobs["label"].shape == (shape[0],)
    assert full.layers[0].type == "Data"
    assert timed.layer_names[1:] == full.layer_names[1:]  # every other layer, in order
    for name in full.layer_names[1:]:
        assert [b.shape for b in timed.layer_dict[name].blobs] == [b.shape for b in full.layer_dict[name].blobs]


FAKE_CAFFE = """#!{python}
import os, sys
args = sys.argv[1:]
assert args[0] == "time" and args[1] == "-model" and args[3] == "-iterations", args
assert os.path.exists(args[2]) and "Input" in open(args[2]).read()
print("I1201 04:00:00.000000  1 caffe.cpp:404] Average Forward pass: 5.1 ms.", file=sys.stderr)
print("I1201 04:00:00.000000  1 caffe.cpp:406] Average Backward pass: 7.3 ms.", file=sys.stderr)
print("I1201 04:00:00.000000  1 caffe.cpp:408] Average Forward-Backward: {ms} ms.", file=sys.stderr)
print("I1201 04:00:00.000000  1 caffe.cpp:410] Total Time: 1240 ms.", file=sys.stderr)
"""


def test_caffe_rows_read_caffe_times_average(tmp_path):
    binary = tmp_path / "caffe"
    binary.write_text(FAKE_CAFFE.format(python=sys.executable, ms="12.4"))
    binary.chmod(0o755)
    times, _ = bench.run_caffe("lenet", {"binary": str(binary)}, 20, 5)
    assert times == [pytest.approx(0.0124)]
    labels = [label for label, cfg in bench.configurations(2, str(binary)) if cfg["fw"] == "caffe"]
    assert labels == ["caffe time 1 thread (fwd+bwd, no update)", "caffe time 2 threads (fwd+bwd, no update)"]
    assert not [c for c in bench.configurations(2) if c[1]["fw"] == "caffe"]


def test_a_failing_caffe_is_reported_with_its_log(tmp_path):
    binary = tmp_path / "caffe"
    binary.write_text(
        f"#!{sys.executable}\nimport sys\nprint('F1201 net.cpp:1] Check failed: bad layer', file=sys.stderr)\nsys.exit(134)\n"
    )
    binary.chmod(0o755)
    with pytest.raises(SystemExit, match="(?s)caffe time failed \\(exit 134\\).*Check failed: bad layer"):
        bench.run_caffe("lenet", {"binary": str(binary)}, 20, 5)
