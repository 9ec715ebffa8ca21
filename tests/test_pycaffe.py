"""pycaffe's modules beyond Net and Solver: caffe_pb2 with protobuf's methods and text_format,
NetSpec (``layers as L, params as P``), caffe.io's image helpers, and draw_net."""

import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import layers as L
from minicaffe import params as P
from minicaffe.errors import MinicaffeError
from minicaffe.proto import caffe_pb2, text_format

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- caffe_pb2 --------------------------------------------------------------------------------------
def notebook_solver(train, test):
    """The notebook's "define a solver in Python" cell (01-learning-lenet), as written."""
    s = caffe_pb2.SolverParameter()
    s.random_seed = 0xCAFFE
    s.train_net = train
    s.test_net.append(test)
    s.test_interval = 500
    s.test_iter.append(100)
    s.max_iter = 10000
    s.type = "SGD"
    s.base_lr = 0.01
    s.momentum = 0.9
    s.weight_decay = 5e-4
    s.lr_policy = "inv"
    s.gamma = 0.0001
    s.power = 0.75
    s.display = 1000
    s.snapshot = 5000
    s.snapshot_prefix = "mnist/custom_net"
    s.solver_mode = caffe_pb2.SolverParameter.GPU
    return s


def test_str_of_a_solver_parameter_is_text_minicaffe_reads_back(tmp_path):
    s = notebook_solver("train.prototxt", "test.prototxt")
    text = str(s)
    assert not text.startswith("SolverParameter")  # the text format, not a repr
    assert 'train_net: "train.prototxt"\n' in text and "solver_mode: GPU\n" in text
    assert s.solver_mode == "GPU" and caffe_pb2.SolverParameter.GPU == 1
    (tmp_path / "s.prototxt").write_text(text)
    from minicaffe import proto

    back = proto.parse_file(str(tmp_path / "s.prototxt"), "SolverParameter")
    assert back == s and back.random_seed == 0xCAFFE and list(back.test_iter) == [100]
    assert text_format.MessageToString(s) == text
    merged = text_format.Merge(text, caffe_pb2.SolverParameter())
    assert merged == s


def test_binary_round_trip_as_pycaffe_scripts_do():
    net = caffe_pb2.NetParameter()
    net.name = "tiny"
    layer = net.layer.add()
    layer.name, layer.type = "ip", "InnerProduct"
    layer.inner_product_param.num_output = 3
    blob = layer.blobs.add()
    blob.shape.dim.extend([3, 2])
    blob.data.extend([0.5, -1.0, 2.0, 0.0, 1.5, 3.0])
    data = net.SerializeToString()
    back = caffe_pb2.NetParameter()
    assert back.ParseFromString(data) == len(data)
    assert back == net and back.layer[0].inner_product_param.num_output == 3
    assert np.array_equal(np.asarray(back.layer[0].blobs[0].data), [0.5, -1.0, 2.0, 0.0, 1.5, 3.0])
    copy = caffe_pb2.NetParameter()
    copy.CopyFrom(back)
    copy.layer[0].name = "changed"
    assert back.layer[0].name == "ip"
    assert back.HasField("name") and not caffe_pb2.NetParameter().HasField("name")
    back.ClearField("name")
    assert not back.HasField("name") and [f.name for f, _ in back.ListFields()] == ["layer"]
    assert isinstance(back, caffe_pb2.NetParameter) and not isinstance(back, caffe_pb2.SolverParameter)
    assert caffe_pb2.TRAIN == 0 and caffe_pb2.TEST == 1 and caffe_pb2.PoolingParameter.MAX == 0
    assert caffe_pb2.PoolingParameter.PoolMethod.Name(1) == "AVE"


def test_a_caffemodel_written_by_minicaffe_parses_with_caffe_pb2(tmp_path):
    net = caffe.Net(os.path.join(ROOT, "nets", "lenet.prototxt"), caffe.TEST)
    net.save(str(tmp_path / "w.caffemodel"))
    msg = caffe_pb2.NetParameter()
    msg.ParseFromString((tmp_path / "w.caffemodel").read_bytes())
    conv1 = [layer for layer in msg.layer if layer.name == "conv1"][0]
    arr = caffe.io.blobproto_to_array(conv1.blobs[0])
    np.testing.assert_array_equal(arr, net.params["conv1"][0].data)


# -- NetSpec ----------------------------------------------------------------------------------------
def test_netspec_writes_what_pycaffe_writes():
    n = caffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[2, 1, 8, 8]), dict(dim=[2])], ntop=2)
    n.conv = L.Convolution(n.data, kernel_size=3, num_output=4, param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.pool = L.Pooling(n.conv, pool=P.Pooling.AVE, kernel_size=2, stride=2)
    n.relu = L.ReLU(n.pool, in_place=True)
    n.ip = L.InnerProduct(n.relu, num_output=3, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip, n.label, loss_weight=2, include=dict(phase=caffe.TRAIN))
    n.silent = L.Silence(L.Sigmoid(n.ip), ntop=0)
    text = str(n.to_proto())
    assert text.startswith('layer {\n  name: "data"\n  type: "DummyData"\n  top: "data"\n  top: "label"\n')
    assert "  param {\n    lr_mult: 1\n  }\n  param {\n    lr_mult: 2\n  }\n" in text
    assert "pooling_param {\n    pool: AVE\n" in text
    assert 'name: "relu"\n  type: "ReLU"\n  bottom: "pool"\n  top: "pool"\n' in text
    assert "loss_weight: 2\n" in text and "include {\n    phase: TRAIN\n  }" in text
    assert 'name: "Sigmoid1"' in text and 'name: "silent"' in text  # unnamed layers: <Type><k>
    net = caffe.Net(str(n.to_proto()), caffe.TRAIN)  # and minicaffe builds it
    assert net.blobs["ip"].data.shape == (2, 3)
    with pytest.raises(TypeError, match="Convolution input 0 is not a Top"):
        L.Convolution("data", num_output=1)
    with pytest.raises(AttributeError, match="no message NopeParameter"):
        P.Nope.X  # noqa: B018


# -- caffe.io -----------------------------------------------------------------------------------------
def test_load_image_as_pycaffe(tmp_path):
    from PIL import Image

    rgb = (np.arange(12 * 16 * 3) % 251).astype(np.uint8).reshape(12, 16, 3)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    im = caffe.io.load_image(str(tmp_path / "a.png"))
    assert im.dtype == np.float32 and im.shape == (12, 16, 3)
    np.testing.assert_array_equal(im, rgb / np.float32(255))
    Image.fromarray(rgb[:, :, 0]).save(tmp_path / "g.png")
    gray = caffe.io.load_image(str(tmp_path / "g.png"))
    assert gray.shape == (12, 16, 3) and np.array_equal(gray[:, :, 0], gray[:, :, 2])
    assert caffe.io.load_image(str(tmp_path / "g.png"), color=False).shape == (12, 16, 1)
    Image.fromarray(np.dstack([rgb, np.full((12, 16), 7, np.uint8)])).save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(caffe.io.load_image(str(tmp_path / "rgba.png")), im)  # alpha dropped
    Image.fromarray(rgb).save(tmp_path / "a.jpg", quality=95)
    assert np.abs(caffe.io.load_image(str(tmp_path / "a.jpg")) - im).mean() < 0.05
    with pytest.raises(MinicaffeError, match="no such file"):
        caffe.io.load_image(str(tmp_path / "none.jpg"))
    (tmp_path / "x.jpg").write_bytes(b"not an image")
    with pytest.raises(MinicaffeError, match="not an image Pillow can read"):
        caffe.io.load_image(str(tmp_path / "x.jpg"))


def test_resize_oversample_and_the_transformer_pipeline():
    im = np.random.default_rng(0).random((10, 12, 3)).astype(np.float32)
    small = caffe.io.resize_image(im, (5, 6))
    assert small.shape == (5, 6, 3) and small.min() >= 0 and small.max() <= 1
    np.testing.assert_array_equal(caffe.io.resize_image(im, (20, 24), interp_order=0)[::2, ::2], im)
    crops = caffe.io.oversample([im], (6, 8))
    assert crops.shape == (10, 6, 8, 3)
    np.testing.assert_array_equal(crops[0], im[:6, :8])
    np.testing.assert_array_equal(crops[5], im[:6, :8][:, ::-1])
    # 00-classification's preprocessing cells
    t = caffe.io.Transformer({"data": (1, 3, 10, 12)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", np.array([104.0, 117.0, 123.0]))
    t.set_raw_scale("data", 255)
    t.set_channel_swap("data", (2, 1, 0))
    x = t.preprocess("data", im)
    assert x.shape == (3, 10, 12)
    np.testing.assert_allclose(x[0], im[:, :, 2] * 255 - 104, rtol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", x), im, atol=1e-5)


# -- draw_net ------------------------------------------------------------------------------------------
def test_draw_net_tool_writes_a_png(tmp_path, capsys):
    from minicaffe.draw import build_graph, layout
    from minicaffe.net import load_net_param
    from minicaffe.tools import draw_net

    out = tmp_path / "lenet.png"
    assert draw_net.main([os.path.join(ROOT, "nets", "lenet_train_test.prototxt"), str(out), "--phase", "TRAIN"]) == 0
    head = out.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    from PIL import Image

    w, h = Image.open(out).size
    assert w > 3 * h  # left to right
    nodes, edges = build_graph(load_net_param(os.path.join(ROOT, "nets", "lenet_train_test.prototxt")), "TRAIN")
    layers = [label.split("\n")[0] for kind, label, _ in nodes.values() if kind == "layer"]
    assert layers == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"]
    pos, bends = layout(nodes, edges)
    ranks = [pos[a][0] < pos[b][0] for a, b in edges]
    assert all(ranks)  # every arrow goes forward
    assert sum(len(b) for b in bends.values()) > 0  # the label's long edge is routed
    assert "kernel 5, out 20\nstride 1, pad 0" in "".join(label for _, label, _ in nodes.values())
    assert (
        draw_net.main([os.path.join(ROOT, "nets", "lenet.prototxt"), str(tmp_path / "t.svg"), "--rankdir", "TB"]) == 0
    )
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")
    assert draw_net.main(["no_such_net", str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err.startswith("error: no net 'no_such_net'")


def test_draw_net_legacy_input_fields_and_the_pyplot_backend_left_alone():
    import matplotlib

    from minicaffe import draw, proto

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands for a notebook's inline backend: draw_net must not switch it
    p = proto.parse(
        'name: "x"\ninput: "data"\ninput_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }\n',
        "NetParameter",
    )
    try:
        png = draw.draw_net(p)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    nodes, edges = draw.build_graph(p)
    assert ("blob:data:0", "layer:0:ip") in edges
