"""minicaffe's Caffe files against Google's protobuf compiled from Caffe's own caffe.proto: the
same messages serialize to the same bytes, and each side parses the other's.

Needs ``CAFFE_ROOT`` (a checkout of BVLC/caffe, for src/caffe/proto/caffe.proto) and the
packages ``protobuf`` and ``grpcio-tools`` (its protoc); skipped, saying so, without them::

    pip install protobuf grpcio-tools
    CAFFE_ROOT=~/caffe python -m pytest tests/test_caffe_protobuf.py
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from minicaffe.data.datum import decode_datum, encode_datum
from minicaffe.solvers.caffe_state import decode_state, encode_state
from minicaffe.tools.compute_image_mean import mean_blobproto

ROOT = os.environ.get("CAFFE_ROOT")
pytestmark = pytest.mark.skipif(not ROOT, reason="CAFFE_ROOT (a checkout of BVLC/caffe) is not set")


@pytest.fixture(scope="module")
def caffe_pb2(tmp_path_factory):
    pytest.importorskip("google.protobuf", reason="the protobuf package is not installed")
    pytest.importorskip("grpc_tools", reason="grpcio-tools (protoc) is not installed")
    proto_dir = os.path.join(ROOT, "src", "caffe", "proto")
    out = tmp_path_factory.mktemp("pb2")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}", "caffe.proto"], check=True
    )
    sys.path.insert(0, str(out))
    try:
        import caffe_pb2 as module
    finally:
        sys.path.remove(str(out))
    return module


def test_datums_are_caffes_bytes(caffe_pb2):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (3, 5, 7), dtype=np.uint8)
    d = caffe_pb2.Datum()  # convert_imageset (CVMatToDatum): sizes, encoded=false, data, then label
    d.channels, d.height, d.width, d.encoded, d.data, d.label = 3, 5, 7, False, img.tobytes(), 4
    assert d.SerializeToString() == encode_datum(img, 4)
    m = rng.integers(0, 256, (1, 28, 28), dtype=np.uint8)
    d = caffe_pb2.Datum()  # convert_mnist_data: no encoded field
    d.channels, d.height, d.width, d.data, d.label = 1, 28, 28, m.tobytes(), 9
    assert d.SerializeToString() == encode_datum(m, 9, set_encoded=False)
    d = caffe_pb2.Datum()  # ReadFileToDatum
    d.data, d.label, d.encoded = b"\x89PNG....", 2, True
    assert d.SerializeToString() == encode_datum(label=2, encoded_bytes=b"\x89PNG....")
    f = rng.normal(size=(2, 3, 1)).astype(np.float32)
    d = caffe_pb2.Datum()
    d.channels, d.height, d.width = 2, 3, 1
    d.float_data.extend(f.ravel().tolist())
    d.label, d.encoded = 1, False
    assert d.SerializeToString() == encode_datum(f, 1)
    back, label = decode_datum(d.SerializeToString())
    np.testing.assert_array_equal(back, f)


def test_mean_binaryproto_is_caffes_bytes(caffe_pb2):
    s = np.random.default_rng(1).integers(0, 256 * 7, (3, 4, 5)).astype(np.float32)
    b = caffe_pb2.BlobProto()  # compute_image_mean: num, channels, height, width, data
    b.num, b.channels, b.height, b.width = 1, 3, 4, 5
    b.data.extend((s / np.float32(7)).astype(np.float32).ravel().tolist())
    assert b.SerializeToString() == mean_blobproto(s, 7)


def test_solverstate_is_caffes_bytes(caffe_pb2):
    rng = np.random.default_rng(2)
    history = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4,)).astype(np.float32)]
    st = caffe_pb2.SolverState()  # SGDSolver::SnapshotSolverStateToBinaryProto + Blob::ToProto
    st.iter, st.learned_net, st.current_step = 500, "examples/mnist/lenet_iter_500.caffemodel", 1
    for h in history:
        blob = st.history.add()
        blob.shape.dim.extend(h.shape)
        blob.data.extend(h.ravel().tolist())
    assert st.SerializeToString() == encode_state(500, 1, "examples/mnist/lenet_iter_500.caffemodel", history)
    back = decode_state(st.SerializeToString())
    assert (back["iter"], back["current_step"]) == (500, 1)
    for a, b in zip(back["history"], history):
        np.testing.assert_array_equal(a, b)
    parsed = caffe_pb2.SolverState()
    parsed.ParseFromString(encode_state(7, 0, "w.caffemodel", [np.arange(3, dtype=np.float64)]))
    assert parsed.iter == 7 and list(parsed.history[0].double_data) == [0.0, 1.0, 2.0]
