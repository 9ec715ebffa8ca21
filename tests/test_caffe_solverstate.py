"""Caffe's binary SolverState: the bytes against caffe.proto, and minicaffe -> file -> minicaffe
for every solver type (weights, history, iteration and multistep position come back exactly)."""

import struct

import numpy as np
import pytest

from minicaffe import data
from minicaffe.errors import SolverError
from minicaffe.solvers import SOLVERS, get_solver
from minicaffe.solvers.caffe_state import decode_state, encode_state

NET = """
name: "toy"
layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { scale: 0.00390625 } data_param { source: "caffe_state_set" batch_size: 4 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture(autouse=True)
def toy_dataset():
    rng = np.random.default_rng(5)
    data.register_dataset(
        "caffe_state_set", rng.integers(0, 256, (12, 1, 3, 3), dtype=np.uint8), rng.integers(0, 3, 12)
    )
    yield
    data.unregister_dataset("caffe_state_set")


def write_solver(tmp_path, solver_type, fmt="snapshot_format: BINARYPROTO"):
    (tmp_path / "net.prototxt").write_text(NET)
    extra = {
        "SGD": "momentum: 0.9",
        "Nesterov": "momentum: 0.9",
        "AdaGrad": "",
        "RMSProp": "rms_decay: 0.98",
        "AdaDelta": "momentum: 0.95 delta: 1e-6",
        "Adam": "momentum: 0.9 momentum2: 0.999",
    }[solver_type]
    text = (
        f'net: "{tmp_path / "net.prototxt"}" type: "{solver_type}" base_lr: 0.05 lr_policy: "multistep" '
        f"gamma: 0.5 stepvalue: 2 stepvalue: 4 max_iter: 10 display: 0 random_seed: 1 weight_decay: 0.001 "
        f'snapshot_prefix: "{tmp_path / "snap"}" {fmt} {extra}\n'
    )
    path = tmp_path / f"{solver_type}_solver.prototxt"
    path.write_text(text)
    return str(path)


def test_solverstate_bytes_are_caffes_layout():
    h0 = np.array([[1.5, -2.0]], dtype=np.float32)
    h1 = np.array([0.25], dtype=np.float32)
    got = encode_state(7, 2, "snap_iter_7.caffemodel", [h0, h1])

    def blob(values, dims):  # BlobProto: data (5, packed float) then shape (7) { dim (1, packed int64) }
        payload = struct.pack(f"<{len(values)}f", *values)
        dim_bytes = bytes(dims)
        shape = bytes([0x0A, len(dim_bytes)]) + dim_bytes
        body = bytes([0x2A, len(payload)]) + payload + bytes([0x3A, len(shape)]) + shape
        return bytes([0x1A, len(body)]) + body

    name = b"snap_iter_7.caffemodel"
    expected = (
        bytes([0x08, 7, 0x12, len(name)]) + name + blob([1.5, -2.0], [1, 2]) + blob([0.25], [1]) + bytes([0x20, 2])
    )
    assert got == expected
    back = decode_state(got)
    assert back["iter"] == 7 and back["current_step"] == 2 and back["learned_net"] == "snap_iter_7.caffemodel"
    np.testing.assert_array_equal(back["history"][0], h0)
    np.testing.assert_array_equal(back["history"][1], h1)


def test_a_double_net_writes_double_data():
    got = decode_state(encode_state(1, 0, None, [np.array([0.1, 0.2], dtype=np.float64)]))
    assert got["learned_net"] is None and got["history"][0].dtype == np.float64
    np.testing.assert_array_equal(got["history"][0], [0.1, 0.2])


@pytest.mark.parametrize("solver_type", sorted(SOLVERS))
def test_round_trip_through_caffes_solverstate(tmp_path, solver_type, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_solver(tmp_path, solver_type)
    a = get_solver(path, log=lambda m: None)
    a.step(5)
    weights, state = a.snapshot()
    assert open(state, "rb").read(1) == b"\x08"  # a SolverState (iter = field 1), not an .npz
    b = get_solver(path, log=lambda m: None)
    b.restore(state)
    assert (b.iter, b.current_step) == (5, 2)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)
    assert len(a.history) == len(b.history) == len(a.history_names)
    for ha, hb in zip(a.history, b.history):
        for x, y in zip(ha, hb):
            np.testing.assert_array_equal(x, y)
    # the restored solver trains on from there, and its lr follows the restored multistep position
    b.step(1)
    assert b.iter == 6


def test_unset_snapshot_format_keeps_minicaffes_own_state(tmp_path):
    a = get_solver(write_solver(tmp_path, "SGD", fmt=""), log=lambda m: None)
    a.step(1)
    _, state = a.snapshot()
    assert open(state, "rb").read(4) == b"PK\x03\x04"  # the .npz that resumes bit for bit


def test_hdf5_snapshot_format_falls_back_to_minicaffes_state_and_says_so(tmp_path):
    lines = []
    a = get_solver(write_solver(tmp_path, "SGD", fmt="snapshot_format: HDF5"), log=lines.append)
    a.step(1)
    _, state = a.snapshot()
    assert open(state, "rb").read(4) == b"PK\x03\x04"
    assert any("snapshot_format HDF5 is not written by minicaffe" in line for line in lines)


def test_a_state_of_another_solver_type_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sgd = get_solver(write_solver(tmp_path, "SGD"), log=lambda m: None)
    sgd.step(1)
    _, state = sgd.snapshot()
    adam = get_solver(write_solver(tmp_path, "Adam"), log=lambda m: None)
    with pytest.raises(SolverError, match="4 history blobs, but a Adam solver .* keeps 8"):
        adam.restore(state)


def test_a_corrupt_state_names_the_file(tmp_path):
    sgd = get_solver(write_solver(tmp_path, "SGD"), log=lambda m: None)
    bad = tmp_path / "bad.solverstate"
    bad.write_bytes(b"\x08\x05\x1a\xff\xff\x03")  # a history blob that runs past the end
    with pytest.raises(SolverError, match="bad.solverstate: not a Caffe SolverState"):
        sgd.restore(str(bad))
    wrong = tmp_path / "wrong.solverstate"
    wrong.write_bytes(encode_state(3, 0, None, [np.zeros(99, np.float32)] + [np.zeros(5, np.float32)] * 3))
    with pytest.raises(SolverError, match="history blob 0 has shape"):
        sgd.restore(str(wrong))


def test_learned_net_is_found_beside_the_state_when_not_in_the_working_directory(tmp_path, monkeypatch):
    path = write_solver(tmp_path, "SGD")
    a = get_solver(path, log=lambda m: None)
    a.step(2)
    weights, state = a.snapshot()
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "s.solverstate").write_bytes(
        encode_state(2, 0, "some/old/dir/w.caffemodel", [np.asarray(h) for hist in a.history for h in hist])
    )
    (moved / "w.caffemodel").write_bytes(open(weights, "rb").read())
    b = get_solver(path, log=lambda m: None)
    b.restore(str(moved / "s.solverstate"))
    np.testing.assert_array_equal(a.net.learnable_params[0].data, b.net.learnable_params[0].data)


def test_the_train_tool_writes_and_resumes_caffes_state(tmp_path, monkeypatch):
    from minicaffe.tools import train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" display: 0 max_iter: 6 snapshot: 3 '
        'snapshot_prefix: "toy" random_seed: 2 snapshot_format: BINARYPROTO\n'
    )
    out = tmp_path / "run"
    assert train.main(["solver.prototxt", "--output", str(out), "--iters", "3", "--no-plot"]) == 0
    state = out / "toy_iter_3.solverstate"
    assert decode_state(state.read_bytes())["iter"] == 3
    assert train.last_snapshot(str(out)) == str(state)  # a complete snapshot the tool may resume from
    assert train.main(["solver.prototxt", "--output", str(out), "--resume", str(state), "--no-plot"]) == 0
    assert decode_state((out / "toy_iter_6.solverstate").read_bytes())["iter"] == 6


def write_caffe_h5_snapshot(solver, directory, iteration):
    """What Caffe writes with snapshot_format: HDF5 (Net::ToHDF5, SnapshotSolverStateToHDF5),
    written here with h5py from a minicaffe solver's weights and history."""
    h5py = pytest.importorskip("h5py", reason="the data extra (h5py) is not installed")
    weights = str(directory / f"snap_iter_{iteration}.caffemodel.h5")
    state = str(directory / f"snap_iter_{iteration}.solverstate.h5")
    with h5py.File(weights, "w") as f:
        data = f.create_group("data")
        for name, layer in zip(solver.net.layer_names, solver.net.layers):
            group = data.create_group(name)  # every layer has a group, with or without blobs
            for j, blob in enumerate(layer.blobs):
                group[str(j)] = np.asarray(blob.data, dtype=np.float32)
    with h5py.File(state, "w") as f:
        f["iter"] = np.int32(iteration)  # H5LTmake_dataset_int: a scalar
        name = weights.encode() + b"\0"  # H5LTmake_dataset_string: fixed length, NUL-terminated
        f.create_dataset("learned_net", data=np.array(name, dtype=f"S{len(name)}"))
        f["current_step"] = np.int32(solver.current_step)
        history = f.create_group("history")
        for k, h in enumerate(h for hist in solver.history for h in hist):
            history[str(k)] = np.asarray(h, dtype=np.float32)
    return weights, state


@pytest.mark.parametrize("solver_type", ["SGD", "Adam"])
def test_caffes_hdf5_snapshot_resumes(tmp_path, solver_type):
    from minicaffe.net import Net

    path = write_solver(tmp_path, solver_type, fmt="snapshot_format: HDF5")
    a = get_solver(path, log=lambda m: None)
    a.step(5)
    weights, state = write_caffe_h5_snapshot(a, tmp_path, 5)
    b = get_solver(path, log=lambda m: None)
    b.restore(state)
    assert (b.iter, b.current_step) == (5, 2)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)
    for ha, hb in zip(a.history, b.history):
        for x, y in zip(ha, hb):
            np.testing.assert_array_equal(x, y)
    from minicaffe.tools import train

    assert train.resolve_resume_arg(state) == state  # --resume takes it
    train.check_weights_arg(weights)  # --weights takes the .caffemodel.h5
    net = Net(str(tmp_path / "net.prototxt"), "TEST", weights=weights)  # the .caffemodel.h5 alone
    np.testing.assert_array_equal(net.params["ip1"][0].data, a.net.params["ip1"][0].data)


def test_bad_hdf5_snapshots_name_the_file(tmp_path):
    import h5py

    from minicaffe.errors import WeightsError
    from minicaffe.net import Net

    path = write_solver(tmp_path, "SGD")
    sgd = get_solver(path, log=lambda m: None)
    with h5py.File(tmp_path / "bad.solverstate.h5", "w") as f:
        f["current_step"] = 0
    with pytest.raises(SolverError, match=r"bad.solverstate.h5: not a Caffe HDF5 solver state \(no iter or history"):
        sgd.restore(str(tmp_path / "bad.solverstate.h5"))
    with h5py.File(tmp_path / "w.caffemodel.h5", "w") as f:
        f.create_group("data").create_group("ip1")["0"] = np.zeros((2, 2), np.float32)
        f["data/ip1/1"] = np.zeros(5, np.float32)
    with pytest.raises(
        WeightsError,
        match=r"w.caffemodel.h5: layer 'ip1' blob 0: the file has shape \(2, 2\) but the net expects \(5, 9\)",
    ):
        Net(str(tmp_path / "net.prototxt"), "TEST", weights=str(tmp_path / "w.caffemodel.h5"))


def test_minicaffes_own_state_resumes_a_database_run_bit_for_bit(tmp_path, monkeypatch):
    """A Data layer reading an LMDB with the per-epoch shuffle: minicaffe's .npz state keeps the
    reader's position, so the resumed run reads the same batches as the uninterrupted one."""
    pytest.importorskip("lmdb", reason="the data extra (lmdb) is not installed")
    from minicaffe.data.datum import encode_datum
    from minicaffe.data.db import Writer

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(11)
    with Writer("toy_lmdb", "LMDB") as w:
        for i in range(10):
            w.put(f"{i:08d}", encode_datum(rng.integers(0, 256, (1, 3, 3), dtype=np.uint8), i % 3))
    (tmp_path / "net.prototxt").write_text(NET.replace("caffe_state_set", "toy_lmdb?shuffle=true"))
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 10 display: 0 random_seed: 5 '
        'snapshot_prefix: "snap"\n'
    )

    def losses(solver, n):
        out = []
        solver.on_iteration.append(lambda s, loss, lr: out.append(loss))
        solver.step(n)
        return out

    full = losses(get_solver("solver.prototxt", log=lambda m: None), 10)
    a = get_solver("solver.prototxt", log=lambda m: None)
    losses(a, 4)
    _, state = a.snapshot()
    b = get_solver("solver.prototxt", log=lambda m: None)
    b.restore(state)
    assert losses(b, 6) == full[4:]
