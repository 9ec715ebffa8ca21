"""Every net of Caffe's own ``examples/`` and ``models/`` builds and runs forward and backward
in both phases, its data made up where the files are missing: the LMDBs and LevelDBs written by
minicaffe's convert tools, image lists of PNGs, HDF5 files, R-CNN window files and mean files,
all tiny, at the paths the prototxts name (batch sizes cut to 2).

Caffe's files are not part of minicaffe: point ``CAFFE_ROOT`` at a checkout of BVLC/caffe to run
it (``CAFFE_ROOT=~/caffe python -m pytest -m slow tests/test_caffe_examples.py``).  The default
run checks the same machinery on a net written here in the style of
``examples/hdf5_classification``.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from minicaffe import proto
from minicaffe.net import Net

pytest.importorskip("lmdb", reason="the data extra (lmdb) is not installed")
pytest.importorskip("h5py", reason="the data extra (h5py) is not installed")
Image = pytest.importorskip("PIL.Image", reason="the data extra (Pillow) is not installed")

DATUM_SHAPES = {"mnist_siamese": (2, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "ilsvrc12": (3, 256, 256)}
MEAN_SHAPES = {"cifar10": (3, 32, 32), "ilsvrc12": (3, 256, 256)}


def shape_for(path, table):
    for key, shape in table.items():
        if key in path:
            return shape
    raise KeyError(f"no synthetic shape known for {path}")


def make_db(path, backend):
    from minicaffe.data.datum import encode_datum
    from minicaffe.data.db import Writer

    shape = shape_for(path, DATUM_SHAPES)
    rng = np.random.default_rng(0)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with Writer(path, backend) as w:
        for i in range(3):
            w.put(f"{i:08d}", encode_datum(rng.integers(0, 256, shape, dtype=np.uint8), i % 2))


def make_mean(path):
    from minicaffe.tools.compute_image_mean import mean_blobproto

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    Path(path).write_bytes(mean_blobproto(np.full(shape_for(path, MEAN_SHAPES), 384, np.float32), 3))


def make_png(path, h=260, w=300):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


def make_missing_files(net_param):
    """Create, under the working directory, every data file the net's data layers name."""
    import h5py

    for layer in net_param.layer:
        t, tp = layer.type, layer.transform_param
        if tp.mean_file and not os.path.exists(tp.mean_file):
            make_mean(tp.mean_file)
        if t == "Data" and not os.path.exists(layer.data_param.source):
            make_db(layer.data_param.source, "LEVELDB" if "leveldb" in layer.data_param.source else "LMDB")
        elif t == "ImageData" and not os.path.exists(layer.image_data_param.source):
            src = layer.image_data_param.source
            make_png(os.path.join(os.path.dirname(src), "a.png"))
            Path(src).write_text(f"{os.path.dirname(src)}/a.png 1\n{os.path.dirname(src)}/a.png 0\n")
        elif t == "HDF5Data" and not os.path.exists(layer.hdf5_data_param.source):
            src = layer.hdf5_data_param.source
            os.makedirs(os.path.dirname(src), exist_ok=True)
            h5 = src + ".h5"
            with h5py.File(h5, "w") as f:
                f["data"] = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
                f["label"] = (np.arange(6) % 2).astype(np.float32)
            Path(src).write_text(h5 + "\n")
        elif t == "WindowData" and not os.path.exists(layer.window_data_param.source):
            src = layer.window_data_param.source
            make_png(os.path.join(os.path.dirname(src), "w.png"))
            Path(src).write_text(
                f"# 0\n{os.path.dirname(src)}/w.png\n3\n260\n300\n2\n5 0.9 10 20 200 240\n0 0.1 50 50 120 90\n"
            )


def shrink(net_param):
    """Batch sizes (and deploy input batches) cut to 2, so the big ImageNet nets run quickly."""
    for layer in net_param.layer:
        for field in ("data_param", "image_data_param", "hdf5_data_param", "window_data_param"):
            if layer.has(field) and getattr(layer, field).has("batch_size"):
                getattr(layer, field).batch_size = 2
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                shape.dim[0] = 2
    for shape in net_param.input_shape:
        shape.dim[0] = 2
    if len(net_param.input_dim):
        net_param.input_dim[0] = 2


def stages_of(param, phase):
    """The stage sets a phase's include rules name ([()] when none): mnist_autoencoder's TEST
    data comes in the stages 'test-on-train' and 'test-on-test', as its solver asks for them."""
    stages = []
    for layer in param.layer:
        for rule in layer.include:
            if rule.phase == phase and len(rule.stage) and tuple(rule.stage) not in stages:
                stages.append(tuple(rule.stage))
    return stages or [()]


def run_both_phases(path):
    """Build the net at TRAIN and TEST (each stage set its rules name), one forward and backward
    each; -> the (phase, stages) run."""
    ran = []
    for phase in ("TRAIN", "TEST"):
        param = proto.upgrade_net(proto.parse_file(path, "NetParameter"))
        shrink(param)
        make_missing_files(param)
        for stages in stages_of(param, phase):
            net = Net(param, phase, stages=stages)
            net.forward_from_to()
            net.backward_from_to()
            for layer in net.layers:
                if hasattr(layer, "stop"):
                    layer.stop()
            ran.append((phase, stages))
    return ran


HDF5_NET = """
name: "LogisticRegressionNet"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }
        hdf5_data_param { source: "examples/hdf5_classification/data/train.txt" batch_size: 10 } }
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TEST }
        hdf5_data_param { source: "examples/hdf5_classification/data/test.txt" batch_size: 10 } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc1" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "fc1" bottom: "label" top: "accuracy" include { phase: TEST } }
"""


def test_an_hdf5_classification_style_net_runs_on_files_made_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train_val.prototxt").write_text(HDF5_NET)
    assert run_both_phases(str(tmp_path / "train_val.prototxt")) == [("TRAIN", ()), ("TEST", ())]


def caffe_nets():
    root = os.environ.get("CAFFE_ROOT")
    if not root:
        return []
    found = sorted(Path(root).glob("examples/**/*.prototxt")) + sorted(Path(root).glob("models/**/*.prototxt"))
    return [p for p in found if "solver" not in p.name]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CAFFE_ROOT"), reason="CAFFE_ROOT (a checkout of BVLC/caffe) is not set")
@pytest.mark.parametrize("path", caffe_nets(), ids=lambda p: str(p).split("caffe/")[-1])
def test_every_caffe_example_net_builds_and_runs(path, tmp_path, monkeypatch):
    import minicaffe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "caffe", minicaffe)  # pycaffe's Python layers `import caffe`
    monkeypatch.syspath_prepend(str(Path(os.environ["CAFFE_ROOT"]) / "examples" / "pycaffe" / "layers"))
    phases = [phase for phase, _ in run_both_phases(str(path))]
    assert "TRAIN" in phases and "TEST" in phases


def caffe_solvers():
    root = os.environ.get("CAFFE_ROOT")
    if not root:
        return []
    return sorted(Path(root).glob("examples/**/*solver*.prototxt")) + sorted(
        Path(root).glob("models/**/*solver*.prototxt")
    )


def copy_net_shrunk(root, rel):
    """The net file ``rel`` of the Caffe checkout, batch sizes cut, written at the same relative
    path under the working directory (Caffe resolves a solver's nets from its working directory)."""
    src = Path(root) / rel
    if not src.is_file():
        pytest.skip(f"{rel} is not in the Caffe checkout (a notebook generates it)")
    param = proto.upgrade_net(proto.parse_file(str(src), "NetParameter"))
    shrink(param)
    make_missing_files(param)
    os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
    Path(rel).write_text(proto.to_text(param))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CAFFE_ROOT"), reason="CAFFE_ROOT (a checkout of BVLC/caffe) is not set")
@pytest.mark.parametrize("path", caffe_solvers(), ids=lambda p: str(p).split("caffe/")[-1])
def test_every_caffe_example_solver_trains_snapshots_as_caffe_and_resumes(path, tmp_path, monkeypatch):
    import minicaffe
    from minicaffe.solvers import get_solver
    from minicaffe.solvers.caffe_state import decode_state

    root = os.environ["CAFFE_ROOT"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "caffe", minicaffe)
    param = proto.upgrade_solver(proto.parse_file(str(path), "SolverParameter"))
    for field in ("net", "train_net"):
        if param.has(field):
            copy_net_shrunk(root, getattr(param, field))
    for rel in param.test_net:
        copy_net_shrunk(root, rel)
    if param.has("net_param"):
        shrink(param.net_param)
        make_missing_files(param.net_param)
    param.test_iter = [1] * len(param.test_iter)
    param.max_iter, param.display, param.snapshot = 2, 0, 0
    param.snapshot_prefix, param.snapshot_format = "snap", "BINARYPROTO"
    a = get_solver(param, log=lambda m: None)
    a.step(2)
    weights, state = a.snapshot()
    assert decode_state(Path(state).read_bytes())["iter"] == 2
    b = get_solver(param, log=lambda m: None)
    b.restore(state)
    assert b.iter == 2
    for x, y in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(x.data, y.data)
    b.step(1)
    for net in [a.net, b.net] + a.test_nets + b.test_nets:
        for layer in net.layers:
            if hasattr(layer, "stop"):
                layer.stop()
