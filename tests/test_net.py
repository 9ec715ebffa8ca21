"""Net: graph construction (phases, splits, in-place, sharing, pruning) and the pycaffe API."""

import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import proto
from minicaffe.errors import LayerError, MinicaffeError, NetError, WeightsError

NETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nets")

TINY = """
name: "tiny"
input: "data"
input_shape { dim: 2 dim: 3 dim: 5 dim: 5 }
input: "label"
input_shape { dim: 2 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
"""


def make(text, phase=caffe.TRAIN, **kw):
    return caffe.Net(proto.parse(text, "NetParameter", filename="test.prototxt"), phase, **kw)


def fill_inputs(net, rng):
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = rng.integers(0, 3, net.blobs["label"].shape)


def test_tiny_net_structure(rng):
    net = make(TINY, caffe.TEST)
    assert net.inputs == ["data", "label"]
    names = list(net.layer_dict)
    assert names == ["input", "label_input_1_split", "conv", "relu", "ip", "ip_ip_0_split", "loss", "acc"]
    # ip feeds both the loss and the accuracy: a Split was inserted after it
    assert "ip_ip_0_split" in names
    assert net.top_names["ip_ip_0_split"] == ["ip_ip_0_split_0", "ip_ip_0_split_1"]
    assert net.bottom_names["loss"] == ["ip_ip_0_split_0", "label_input_1_split_0"]
    assert sorted(net.outputs) == ["acc", "loss"]
    # relu is in place: its top is the conv blob itself
    assert net.top_names["relu"] == ["conv"]
    assert net.blob_loss_weights["loss"] == 1.0
    assert list(net.params) == ["conv", "ip"]
    assert [b.shape for b in net.params["conv"]] == [(4, 3, 3, 3), (4,)]


def test_train_phase_excludes_test_layers():
    net = make(TINY, caffe.TRAIN)
    assert "acc" not in net.layer_dict
    assert "ip_ip_0_split" not in net.layer_dict
    assert net.outputs == ["loss"]


def test_forward_backward_and_outputs(rng):
    net = make(TINY, caffe.TRAIN)
    fill_inputs(net, rng)
    out = net.forward()
    assert set(out) == {"loss"}
    assert np.isfinite(out["loss"]).all() and out["loss"] > 0
    net.backward()
    assert net.params["conv"][0].asum_diff() > 0
    # labels get no gradient; data gets none either (nothing asked for it)
    assert net.bottom_need_backward[net.layer_names.index("loss")] == [True, False]
    assert not net.layer_need_backward[0]


def test_forward_kwargs_and_shape_error(rng):
    net = make(TINY, caffe.TEST)
    data = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    out = net.forward(data=data, label=np.array([0, 1], np.float32))
    assert set(out) == {"loss", "acc"}
    with pytest.raises(
        NetError, match=r"blob 'data' has shape \(2, 3, 5, 5\) but the array given has shape \(1, 3, 5, 5\)"
    ):
        net.forward(data=data[:1])
    with pytest.raises(NetError, match="did you mean 'data'"):
        net.forward(dta=data)


def test_forward_start_end_and_reshape(rng):
    net = make(TINY, caffe.TEST)
    fill_inputs(net, rng)
    out = net.forward(end="conv")
    assert list(out) == ["conv"]
    full = net.forward()
    again = net.forward(start="relu")
    assert np.allclose(full["loss"], again["loss"])
    net.blobs["data"].reshape(1, 3, 5, 5)
    net.blobs["label"].reshape(1)
    net.reshape()
    assert net.blobs["conv"].shape == (1, 4, 5, 5) and net.blobs["ip"].shape == (1, 3)
    assert net.params["ip"][0].shape == (3, 4 * 5 * 5)  # params keep their shape
    net.blobs["data"].reshape(1, 3, 7, 7)
    with pytest.raises(LayerError, match=r"layer 'ip'.*\(1,4,7,7\) has 196 inputs.*expect 100"):
        net.reshape()
    net.blobs["data"].reshape(1, 3, 5, 5)
    with pytest.raises(NetError, match="no layer named 'nope'"):
        net.forward(end="nope")


def test_force_backward_and_pruning(rng):
    net = make("force_backward: true\n" + TINY, caffe.TRAIN)
    fill_inputs(net, rng)
    net.forward()
    diffs = net.backward()
    assert set(diffs) == {"data", "label"}
    assert np.abs(diffs["data"]).sum() > 0
    loss_i = net.layer_names.index("loss")
    assert net.bottom_need_backward[loss_i] == [True, False]  # labels never get a gradient


def test_layer_not_under_loss_is_pruned():
    text = (
        TINY
        + 'layer { name: "side" type: "InnerProduct" bottom: "conv" top: "side" inner_product_param { num_output: 2 } }'
    )
    net = make(text, caffe.TRAIN)
    assert not net.layer_need_backward[net.layer_names.index("side")]
    assert net.layer_need_backward[net.layer_names.index("ip")]


def test_lr_mult_zero_freezes_and_prunes():
    text = TINY.replace('top: "conv"\n', 'top: "conv" param { lr_mult: 0 } param { lr_mult: 0 }\n', 1)
    net = make(text, caffe.TRAIN)
    conv = net.layer_dict["conv"]
    assert conv.param_propagate_down == [False, False]
    assert not net.layer_need_backward[net.layer_names.index("conv")]
    assert net.params_lr[:2] == [0.0, 0.0]


def test_include_exclude_levels_and_stages():
    text = """
    input: "x" input_shape { dim: 1 dim: 2 }
    layer { name: "a" type: "ReLU" bottom: "x" top: "a" include { stage: "deploy" } }
    layer { name: "b" type: "ReLU" bottom: "x" top: "b" exclude { stage: "deploy" } }
    layer { name: "c" type: "ReLU" bottom: "x" top: "c" include { min_level: 1 } }
    layer { name: "d" type: "ReLU" bottom: "x" top: "d" include { phase: TEST not_stage: "deploy" } }
    """
    assert set(make(text, caffe.TEST).layer_dict) >= {"b", "d"}
    assert "a" not in make(text, caffe.TEST).layer_dict
    n = make(text, caffe.TEST, stages=["deploy"], level=1)
    assert {"a", "c"} <= set(n.layer_dict) and not {"b", "d"} & set(n.layer_dict)
    with pytest.raises(NetError, match="both include and exclude"):
        make(
            'input: "x" input_shape { dim: 1 } layer { name: "a" type: "ReLU" bottom: "x" top: "a" '
            "include { phase: TEST } exclude { phase: TRAIN } }"
        )


def test_shared_parameters_share_data_and_sum_gradients(rng):
    text = """
    input: "x" input_shape { dim: 3 dim: 4 }
    layer { name: "fa" type: "InnerProduct" bottom: "x" top: "a" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
    layer { name: "fb" type: "InnerProduct" bottom: "x" top: "b" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
    layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
    layer { name: "loss" type: "EuclideanLoss" bottom: "s" bottom: "x2" top: "loss" }
    input: "x2" input_shape { dim: 3 dim: 2 }
    """
    text = text.replace(
        'input: "x" input_shape { dim: 3 dim: 4 }',
        'input: "x" input_shape { dim: 3 dim: 4 } input: "x2" input_shape { dim: 3 dim: 2 }',
    )
    text = text.replace('    input: "x2" input_shape { dim: 3 dim: 2 }\n', "")
    net = make(text, caffe.TRAIN)
    wa, wb = net.params["fa"][0], net.params["fb"][0]
    assert wa.shares_data_with(wb)
    assert len(net.learnable_params) == 2
    assert net.params_owner == [None, None, 0, 1]
    net.blobs["x"].data[...] = rng.standard_normal((3, 4))
    net.blobs["x2"].data[...] = rng.standard_normal((3, 2))
    net.clear_param_diffs()
    net.forward()
    net.backward()
    # both layers compute the same a = b, s = 2a; d loss / dW = 2 * (s - x2)^T x summed over the two uses
    s = net.blobs["s"].data.astype(np.float64)
    x = net.blobs["x"].data.astype(np.float64)
    resid = (s - net.blobs["x2"].data) / 3.0
    expected = 2 * resid.T @ x
    np.testing.assert_allclose(wa.diff, expected, rtol=1e-4, atol=1e-5)


def test_shared_parameter_shape_mismatch_names_layer():
    text = """
    input: "x" input_shape { dim: 3 dim: 4 }
    layer { name: "fa" type: "InnerProduct" bottom: "x" top: "a" param { name: "w" } inner_product_param { num_output: 2 } }
    layer { name: "fb" type: "InnerProduct" bottom: "x" top: "b" param { name: "w" } inner_product_param { num_output: 3 } }
    """
    with pytest.raises(LayerError, match=r"layer 'fb'.*shared parameter 'w' has shape \(3, 4\) here but \(2, 4\)"):
        make(text)


def test_missing_bottom_and_duplicate_top_errors():
    with pytest.raises(
        LayerError, match=r"layer 'r' \(type ReLU\): bottom blob 'dat' is not produced.*did you mean 'data'"
    ):
        make('input: "data" input_shape { dim: 1 } layer { name: "r" type: "ReLU" bottom: "dat" top: "r" }')
    with pytest.raises(LayerError, match="top blob 'data' is produced by an earlier layer"):
        make(
            'input: "data" input_shape { dim: 1 } input: "y" input_shape { dim: 1 } '
            'layer { name: "r" type: "ReLU" bottom: "y" top: "data" }'
        )
    # two layers of one name are allowed, as in Caffe; lookups by name see the last one
    net = make(
        'input: "data" input_shape { dim: 1 } layer { name: "r" type: "ReLU" bottom: "data" top: "a" } '
        'layer { name: "r" type: "ReLU" bottom: "a" top: "b" }'
    )
    assert net.duplicate_layer_names == ["r"] and net.layer_dict["r"] is net.layers[-1]


def test_unknown_layer_type_did_you_mean():
    with pytest.raises(LayerError, match=r"unknown layer type 'Convolutoin'.*did you mean 'Convolution'"):
        make('input: "data" input_shape { dim: 1 } layer { name: "c" type: "Convolutoin" bottom: "data" top: "c" }')


def test_shape_error_names_layer_and_shapes():
    with pytest.raises(LayerError) as info:
        make(
            'input: "a" input_shape { dim: 2 dim: 3 } input: "b" input_shape { dim: 2 dim: 4 } '
            'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "c" }'
        )
    msg = str(info.value).replace(" ", "")
    assert "'e'" in msg and "(2,3)" in msg and "(2,4)" in msg


def test_phase_argument_forms(tmp_path):
    path = tmp_path / "t.prototxt"
    path.write_text(TINY)
    assert caffe.Net(str(path), caffe.TEST).phase == "TEST"
    assert caffe.Net(str(path), phase=caffe.TRAIN).phase == "TRAIN"
    with pytest.raises(MinicaffeError, match="needs a phase"):
        caffe.Net(str(path))
    with pytest.raises(MinicaffeError, match="missing.prototxt.*No such file"):
        caffe.Net(str(tmp_path / "missing.prototxt"), caffe.TEST)


@pytest.mark.parametrize("ext", [".npz", ".caffemodel"])
def test_save_and_copy_from_round_trip(tmp_path, rng, ext):
    caffe.set_random_seed(1)
    a = make(TINY, caffe.TEST)
    caffe.set_random_seed(2)
    b = make(TINY, caffe.TEST)
    assert not np.array_equal(a.params["conv"][0].data, b.params["conv"][0].data)
    path = str(tmp_path / f"w{ext}")
    a.save(path)
    b.copy_from(path)
    for name in a.params:
        for pa, pb in zip(a.params[name], b.params[name]):
            np.testing.assert_array_equal(pa.data, pb.data)
    c = caffe.Net(proto.parse(TINY, "NetParameter"), path, caffe.TEST)
    np.testing.assert_array_equal(c.params["ip"][0].data, a.params["ip"][0].data)


def test_copy_from_shape_mismatch_changes_nothing(tmp_path):
    a = make(TINY, caffe.TEST)
    path = str(tmp_path / "w.npz")
    a.save(path)
    other = make(TINY.replace("num_output: 3", "num_output: 5"), caffe.TEST)
    before = other.params["conv"][0].data.copy()
    with pytest.raises(
        WeightsError, match=r"layer 'ip' blob 0: the file has shape \(3, 100\) but the net expects \(5, 100\)"
    ):
        other.copy_from(path)
    np.testing.assert_array_equal(other.params["conv"][0].data, before)
    with pytest.raises(WeightsError, match="not found"):
        other.copy_from(str(tmp_path / "nope.caffemodel"))


def test_caffemodel_legacy_4d_blob_shapes(tmp_path):
    """Old caffemodels store an InnerProduct weight as (1, 1, out, in): Caffe accepts it."""
    net = make(TINY, caffe.TEST)
    msg = proto.Message("NetParameter", name="tiny")
    lp = msg.add("layer", name="ip", type="InnerProduct")
    w = np.arange(300, dtype=np.float32).reshape(3, 100)
    b = lp.add("blobs", num=1, channels=1, height=3, width=100)
    b.data = w.ravel()
    lp.add("blobs", num=1, channels=1, height=1, width=3).data = np.ones(3, np.float32)
    path = tmp_path / "legacy.caffemodel"
    path.write_bytes(proto.encode(msg))
    net.copy_from(str(path))
    np.testing.assert_array_equal(net.params["ip"][0].data, w)


def test_v1_legacy_net_loads(rng):
    text = """
    name: "legacy"
    input: "data"
    input_dim: 2 input_dim: 1 input_dim: 8 input_dim: 8
    layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
             blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
             convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
    layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
    layers { name: "relu1" type: RELU bottom: "pool1" top: "pool1" }
    layers { name: "prob" type: SOFTMAX bottom: "pool1" top: "prob" }
    """
    net = make(text, caffe.TEST)
    assert [l.type for l in net.layers] == ["Input", "Convolution", "Pooling", "ReLU", "Softmax"]
    assert net.params_lr == [1.0, 2.0] and net.params_weight_decay == [1.0, 0.0]
    out = net.forward(data=rng.standard_normal((2, 1, 8, 8)))
    assert out["prob"].shape == (2, 3, 3, 3)
    np.testing.assert_allclose(out["prob"].sum(axis=1), 1.0, rtol=1e-5)


def numeric_net_gradient_check(net, blob_names, rng, eps=1e-6, samples=12):
    """Central differences of the net's loss with respect to chosen data blobs and parameters."""
    net.clear_param_diffs()
    net.forward()
    net.backward()
    checks = [(name, net.blobs[name]) for name in blob_names]
    checks += [(f"{lname}[{i}]", b) for lname, bl in net.params.items() for i, b in enumerate(bl)]
    for label, blob in checks:
        analytic = blob.diff.copy() if label in blob_names else blob.diff.copy()
        flat = blob.data.reshape(-1)
        for idx in rng.choice(flat.size, size=min(samples, flat.size), replace=False):
            old = flat[idx]
            flat[idx] = old + eps
            lp = net.forward_from_to(1)
            flat[idx] = old - eps
            lm = net.forward_from_to(1)
            flat[idx] = old
            numeric = (lp - lm) / (2 * eps)
            a = analytic.reshape(-1)[idx]
            tol = 1e-4 * max(1.0, abs(a), abs(numeric))
            assert abs(a - numeric) <= tol, f"{label} index {idx}: analytic {a} numeric {numeric} tol {tol}"


def test_whole_net_gradient_float64(rng):
    text = """
    name: "grad"
    force_backward: true
    input: "data" input_shape { dim: 2 dim: 2 dim: 7 dim: 7 }
    input: "label" input_shape { dim: 2 }
    layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
            convolution_param { num_output: 3 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                                bias_filler { type: "gaussian" std: 0.5 } } }
    layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
    layer { name: "sig" type: "Sigmoid" bottom: "pool" top: "pool" }
    layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" inner_product_param { num_output: 4
            weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    """
    net = make(text, caffe.TRAIN, dtype=np.float64)
    net.blobs["data"].data[...] = rng.standard_normal((2, 2, 7, 7))
    net.blobs["label"].data[...] = [1, 3]
    numeric_net_gradient_check(net, ["data"], rng)


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick_train_test", "cifar10_full_train_test"])
def test_shipped_nets_load_with_synthetic_data(name, rng, monkeypatch):
    """Our nets/ definitions build in both phases and run forward/backward (data from a registered set)."""
    from minicaffe import data

    path = os.path.join(NETS, f"{name}.prototxt")
    if name == "lenet":
        net = caffe.Net(path, caffe.TEST)
        net.blobs["data"].reshape(2, 1, 28, 28)
        net.reshape()
        out = net.forward(data=rng.random((2, 1, 28, 28)).astype(np.float32))
        assert out["prob"].shape == (2, 10)
        return
    shape = (3, 32, 32)
    images = rng.integers(0, 256, size=(40,) + shape, dtype=np.uint8)
    labels = rng.integers(0, 10, size=40)
    data.register_dataset("cifar10_train", images, labels)
    data.register_dataset("cifar10_test", images, labels)
    text = open(path).read().replace("batch_size: 100", "batch_size: 4")
    for phase in (caffe.TRAIN, caffe.TEST):
        net = caffe.Net(proto.parse(text, "NetParameter", filename=path), phase)
        loss = net.forward_backward() if phase == caffe.TRAIN else net.forward_from_to()
        assert np.isfinite(loss) and loss > 0
        assert net.blobs["data"].shape == (4, 3, 32, 32)


def test_pycaffe_io_helpers(rng):
    from minicaffe import io

    mean = rng.random((3, 4, 5)).astype(np.float32)
    blob = proto.decode(proto.encode(io.array_to_blobproto(mean)), "BlobProto")
    np.testing.assert_array_equal(io.blobproto_to_array(blob), mean)
    t = io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    image = rng.random((4, 5, 3)).astype(np.float32)
    x = t.preprocess("data", image)
    expected = image.transpose(2, 0, 1)[::-1] * 255 - np.array([10.0, 20.0, 30.0])[:, None, None]
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    np.testing.assert_allclose(t.deprocess("data", x), image, rtol=1e-5, atol=1e-6)
    with pytest.raises(MinicaffeError, match="'dta' is not one of its inputs"):
        t.preprocess("dta", image)


def test_a_blob_reshaped_to_its_own_shape_keeps_its_arrays():
    """A net reshapes every layer before every forward: a blob whose shape does not change keeps
    its views (no new array per access) and contents; a new shape gives new views."""
    from minicaffe.blob import Blob

    b = Blob((2, 3, 4))
    b.data[...] = np.arange(24).reshape(2, 3, 4)
    data, diff, flat = b.dev_data, b.dev_diff, b.dev_flat_data
    b.reshape((2, 3, 4))
    b.reshape(2, 3, 4)
    assert b.dev_data is data and b.dev_diff is diff and b.data is data
    np.testing.assert_array_equal(b.data, np.arange(24).reshape(2, 3, 4))
    assert b.dev_flat_data.base is flat.base
    b.reshape((6, 4))
    assert b.dev_data.shape == (6, 4) and b.dev_data is not data
    b.reshape((2, 3, 4))
    assert b.dev_data.shape == (2, 3, 4) and b.count == 24
