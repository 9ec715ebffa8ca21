"""Whole nets in the shape of Caffe's model zoo, at toy sizes, through ``minicaffe.Net``:

- GoogLeNet-style: conv / max pool / LRN stem, two inception modules (1x1, 3x3 and 5x5 branches
  behind 1x1 reductions, a 3x3 max pool branch with a 1x1 projection, Concat), an auxiliary
  classifier after each (AVE pool, 1x1 conv, fc, Dropout 0.7, loss_weight 0.3), the main head
  (AVE pool, Dropout 0.4, fc, loss), Accuracy at TEST.
- AlexNet-style: strided conv, LRN, overlapping max pooling, grouped convolutions (group 2),
  fc layers with Dropout.

Each runs forward and backward; the loss is checked against the sum of its weighted loss tops,
and a float64 spot check compares the analytic gradient of the net's loss (parameters and the
input, with force_backward) to central differences, Dropout masks held fixed by the seed.
"""

import numpy as np
import pytest

import minicaffe
from minicaffe.rng import set_random_seed


def conv(name, bottom, n, k, stride=1, pad=0, group=1, relu=True):
    text = f'''layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"
  convolution_param {{ num_output: {n} kernel_size: {k} stride: {stride} pad: {pad} group: {group}
    weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" value: 0.1 }} }} }}
'''
    if relu:
        text += f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    return text


def pool(name, bottom, method, k, stride, pad=0):
    return f'''layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}"
  pooling_param {{ pool: {method} kernel_size: {k} stride: {stride} pad: {pad} }} }}
'''


def lrn(name, bottom):
    return f'''layer {{ name: "{name}" type: "LRN" bottom: "{bottom}" top: "{name}"
  lrn_param {{ local_size: 5 alpha: 0.0001 beta: 0.75 }} }}
'''


def fc(name, bottom, n, relu=False, dropout=None):
    text = f'''layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}"
  inner_product_param {{ num_output: {n} weight_filler {{ type: "xavier" }}
    bias_filler {{ type: "constant" value: 0.1 }} }} }}
'''
    if relu:
        text += f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    if dropout is not None:
        text += (
            f'layer {{ name: "{name}_drop" type: "Dropout" bottom: "{name}" top: "{name}" '
            f"dropout_param {{ dropout_ratio: {dropout} }} }}\n"
        )
    return text


def loss(name, bottom, weight=1.0):
    return f'''layer {{ name: "{name}" type: "SoftmaxWithLoss" bottom: "{bottom}" bottom: "label" top: "{name}"
  loss_weight: {weight} }}
layer {{ name: "{name}_acc" type: "Accuracy" bottom: "{bottom}" bottom: "label" top: "{name}_acc"
  include {{ phase: TEST }} }}
'''


def inputs(c, h, w, n=2):
    return f"""layer {{ name: "data" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: {n} dim: {c} dim: {h} dim: {w} }} shape {{ dim: {n} }} }} }}
"""


def inception(name, bottom, n1, r3, n3, r5, n5, proj):
    return (
        conv(f"{name}/1x1", bottom, n1, 1)
        + conv(f"{name}/3x3_reduce", bottom, r3, 1)
        + conv(f"{name}/3x3", f"{name}/3x3_reduce", n3, 3, pad=1)
        + conv(f"{name}/5x5_reduce", bottom, r5, 1)
        + conv(f"{name}/5x5", f"{name}/5x5_reduce", n5, 5, pad=2)
        + pool(f"{name}/pool", bottom, "MAX", 3, 1, pad=1)
        + conv(f"{name}/pool_proj", f"{name}/pool", proj, 1)
        + f'''layer {{ name: "{name}/output" type: "Concat" bottom: "{name}/1x1" bottom: "{name}/3x3"
  bottom: "{name}/5x5" bottom: "{name}/pool_proj" top: "{name}/output" }}
'''
    )


def aux_head(name, bottom, classes):
    return (
        pool(f"{name}/ave_pool", bottom, "AVE", 3, 2)
        + conv(f"{name}/conv", f"{name}/ave_pool", 4, 1)
        + fc(f"{name}/fc", f"{name}/conv", 6, relu=True, dropout=0.7)
        + fc(f"{name}/classifier", f"{name}/fc", classes)
        + loss(f"{name}/loss", f"{name}/classifier", 0.3)
    )


CLASSES = 5

GOOGLENET = (
    'name: "TinyGoogLeNet" force_backward: true\n'
    + inputs(3, 20, 20)
    + conv("conv1", "data", 6, 5, stride=2, pad=2)
    + pool("pool1", "conv1", "MAX", 3, 2)
    + lrn("norm1", "pool1")
    + conv("conv2", "norm1", 8, 3, pad=1)
    + lrn("norm2", "conv2")
    + inception("inc_a", "norm2", 3, 2, 4, 2, 3, 2)  # 12 channels
    + aux_head("loss1", "inc_a/output", CLASSES)
    + inception("inc_b", "inc_a/output", 4, 3, 4, 2, 2, 2)  # 12 channels
    + aux_head("loss2", "inc_b/output", CLASSES)
    + pool("pool5", "inc_b/output", "AVE", 5, 1)
    + 'layer { name: "pool5_drop" type: "Dropout" bottom: "pool5" top: "pool5" dropout_param { dropout_ratio: 0.4 } }\n'
    + fc("classifier", "pool5", CLASSES)
    + loss("loss3", "classifier")
)

ALEXNET = (
    'name: "TinyAlexNet" force_backward: true\n'
    + inputs(3, 31, 31)
    + conv("conv1", "data", 8, 5, stride=2)
    + lrn("norm1", "conv1")
    + pool("pool1", "norm1", "MAX", 3, 2)
    + conv("conv2", "pool1", 8, 3, pad=1, group=2)
    + lrn("norm2", "conv2")
    + pool("pool2", "norm2", "MAX", 3, 2)
    + conv("conv3", "pool2", 6, 3, pad=1)
    + conv("conv4", "conv3", 6, 3, pad=1, group=2)
    + conv("conv5", "conv4", 4, 3, pad=1, group=2)
    + pool("pool5", "conv5", "MAX", 3, 2)
    + fc("fc6", "pool5", 10, relu=True, dropout=0.5)
    + fc("fc7", "fc6", 10, relu=True, dropout=0.5)
    + fc("fc8", "fc7", CLASSES)
    + loss("loss", "fc8")
)

MODELS = {"googlenet": GOOGLENET, "alexnet": ALEXNET}


def build(text, phase, dtype=np.float64, seed=4):
    set_random_seed(seed)
    net = minicaffe.Net(text, phase, dtype=dtype)
    rng = np.random.default_rng(seed)
    net.blobs["data"].data[...] = rng.uniform(-1, 1, net.blobs["data"].shape)
    net.blobs["label"].data[...] = rng.integers(0, CLASSES, net.blobs["label"].shape)
    return net


def test_googlenet_shapes_and_weighted_losses():
    """(seed 4: no ReLU of this tiny net is dead for the whole batch, so every parameter gets a gradient)"""
    net = build(GOOGLENET, "TRAIN")
    assert net.blobs["inc_a/output"].shape == (2, 12, 5, 5)
    assert net.blobs["inc_b/output"].shape == (2, 12, 5, 5)
    assert net.blob_loss_weights == {"loss1/loss": 0.3, "loss2/loss": 0.3, "loss3": 1.0}
    set_random_seed(4)
    total = net.forward_from_to()
    parts = {k: float(net.blobs[k].data) for k in ("loss1/loss", "loss2/loss", "loss3")}
    assert total == pytest.approx(0.3 * parts["loss1/loss"] + 0.3 * parts["loss2/loss"] + parts["loss3"], rel=1e-12)
    assert all(np.log(CLASSES) * 0.5 < v < np.log(CLASSES) * 2 for v in parts.values())
    net.backward_from_to()
    for name, blobs in net.params.items():
        for b in blobs:
            assert np.isfinite(b.diff).all() and np.abs(b.diff).sum() > 0, name


@pytest.mark.parametrize("model", list(MODELS))
def test_test_phase_runs_with_accuracy(model):
    net = build(MODELS[model], "TEST", dtype=np.float32)
    net.forward()
    accs = [k for k in net.outputs if k.endswith("_acc")]
    assert accs and all(0.0 <= float(net.blobs[k].data) <= 1.0 for k in accs)
    assert not any(l.type == "Dropout" and l.phase == "TRAIN" for l in net.layers)


def test_alexnet_grouped_convolutions_are_block_diagonal():
    net = build(ALEXNET, "TRAIN")
    assert net.params["conv2"][0].shape == (8, 4, 3, 3)  # group 2: each filter sees half the channels
    assert net.params["conv4"][0].shape == (6, 3, 3, 3)
    # zeroing the first input half changes only through the first group's filters
    x = net.blobs["pool1"]
    layer = net.layer_dict["conv2"]
    set_random_seed(0)
    net.forward_from_to()
    layer.forward([x], [net.blobs["conv2"]])  # conv2's own output (the net's ReLU ran in place)
    before = net.blobs["conv2"].data.copy()
    x.data[:, :4] = 0
    layer.forward([x], [net.blobs["conv2"]])
    after = net.blobs["conv2"].data
    np.testing.assert_array_equal(before[:, 4:], after[:, 4:])
    assert not np.allclose(before[:, :4], after[:, :4])


def spot_check(net, per_blob=2, step=1e-6, tol=1e-5, seed=11):
    """Analytic gradients of the net's loss vs central differences at ``per_blob`` elements of every
    parameter blob and of the input (the seed is reset before each forward: Dropout stays fixed)."""

    def loss():
        set_random_seed(seed)
        return net.forward_from_to()

    net.clear_param_diffs()
    loss()
    net.backward_from_to()
    blobs = [(f"{name}[{i}]", b) for name, bl in net.params.items() for i, b in enumerate(bl)]
    blobs.append(("data", net.blobs["data"]))
    grads = {name: b.diff.copy() for name, b in blobs}
    rng = np.random.default_rng(seed)
    checked = 0
    for name, b in blobs:
        flat = b.data.reshape(-1)
        for k in rng.choice(flat.size, size=min(per_blob, flat.size), replace=False):
            x0 = flat[k]
            flat[k] = x0 + step
            f_plus = loss()
            flat[k] = x0 - step
            f_minus = loss()
            flat[k] = x0
            numeric = (f_plus - f_minus) / (2 * step)
            analytic = grads[name].reshape(-1)[k]
            bound = tol * max(abs(numeric), abs(analytic), 1e-3) + 1e-9
            assert abs(numeric - analytic) <= bound, (
                f"{net.name}: d loss / d {name} flat index {k}: analytic {analytic:.10g} vs numeric {numeric:.10g}"
            )
            checked += 1
    return checked


@pytest.mark.parametrize("model", list(MODELS))
def test_whole_net_gradient_spot_check(model):
    net = build(MODELS[model], "TRAIN")
    assert spot_check(net) >= 2 * len(net.learnable_params)


def test_float32_net_matches_float64():
    nets = [build(GOOGLENET, "TRAIN", dtype=dt) for dt in (np.float64, np.float32)]
    nets[1].blobs["data"].data[...] = nets[0].blobs["data"].data
    for n32_p, n64_p in zip(nets[1].learnable_params, nets[0].learnable_params):
        n32_p.data[...] = n64_p.data
    losses = []
    for net in nets:
        net.clear_param_diffs()
        set_random_seed(9)
        losses.append(net.forward_from_to())
        net.backward_from_to()
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for p32, p64 in zip(nets[1].learnable_params, nets[0].learnable_params):
        np.testing.assert_allclose(p32.diff, p64.diff, rtol=2e-3, atol=2e-5 * np.abs(p64.diff).max())
