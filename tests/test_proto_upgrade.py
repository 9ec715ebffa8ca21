"""Upgrading legacy nets (V1 layers, data transformations, input_dim) and solvers."""

import numpy as np
import pytest

from minicaffe.errors import PrototxtError
from minicaffe.proto import decode, encode, parse, to_text, upgrade_net, upgrade_solver
from minicaffe.proto.schema import ENUMS
from minicaffe.proto.upgrade import V1_LAYER_TYPES

LEGACY = """\
name: "LegacyNet"
input: "extra"
input_dim: 1
input_dim: 3
input_dim: 8
input_dim: 8
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "mnist_train_lmdb"
    backend: LMDB
    batch_size: 64
    scale: 0.00390625
    mirror: true
    crop_size: 24
    mean_file: "mean.binaryproto"
  }
  include: { phase: TRAIN }
}
layers {
  name: "conv1"
  type: CONVOLUTION
  bottom: "data"
  top: "conv1"
  blobs_lr: 1
  blobs_lr: 2
  weight_decay: 1
  weight_decay: 0
  param: "conv1_w"
  param: "conv1_b"
  convolution_param {
    num_output: 20
    kernel_size: 5
    weight_filler { type: "xavier" }
  }
}
layers {
  name: "relu1"
  type: RELU
  bottom: "conv1"
  top: "conv1"
}
layers {
  name: "loss"
  type: SOFTMAX_LOSS
  bottom: "conv1"
  bottom: "label"
  loss_weight: 2
  exclude { phase: TEST stage: "deploy" }
}
"""

MODERN = """\
name: "LegacyNet"
input: "extra"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer {
  name: "mnist"
  type: "Data"
  top: "data"
  top: "label"
  include { phase: TRAIN }
  transform_param {
    scale: 0.00390625
    mirror: true
    crop_size: 24
    mean_file: "mean.binaryproto"
  }
  data_param { source: "mnist_train_lmdb" backend: LMDB batch_size: 64 }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param { name: "conv1_w" lr_mult: 1 decay_mult: 1 }
  param { name: "conv1_b" lr_mult: 2 decay_mult: 0 }
  convolution_param {
    num_output: 20
    kernel_size: 5
    weight_filler { type: "xavier" }
  }
}
layer {
  name: "relu1"
  type: "ReLU"
  bottom: "conv1"
  top: "conv1"
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "conv1"
  bottom: "label"
  loss_weight: 2
  exclude { phase: TEST stage: "deploy" }
}
"""


def test_v1_net_upgrades_to_the_modern_form():
    legacy = parse(LEGACY, filename="legacy.prototxt")
    upgraded = upgrade_net(legacy)
    expected = parse(MODERN)
    assert upgraded == expected, to_text(upgraded)
    assert legacy.has("layers") and not legacy.has("layer")  # the input is untouched
    # errors about an upgraded layer still point into the legacy file
    assert upgraded.layer[1].loc() == ("legacy.prototxt", 23, 1)


def test_modern_net_is_unchanged():
    modern = parse(MODERN)
    assert upgrade_net(modern) == modern


def test_every_v1_layer_type_has_a_modern_name():
    assert set(V1_LAYER_TYPES) == set(ENUMS["V1LayerParameter.LayerType"])
    for v1_type, modern in V1_LAYER_TYPES.items():
        net = upgrade_net(parse(f'layers {{ name: "x" type: {v1_type} }}'))
        assert net.layer[0].type == modern


def test_v1_caffemodel_blobs_carry_over():
    old = parse('layers { name: "ip" type: INNER_PRODUCT blobs_lr: 1 }')
    blob = old.layers[0].add("blobs", num=1, channels=1, height=2, width=2)
    blob.data = np.array([1, 2, 3, 4], np.float32)
    net = upgrade_net(decode(encode(old), filename="old.caffemodel"))
    assert net.layer[0].type == "InnerProduct"
    assert net.layer[0].blobs[0].height == 2
    np.testing.assert_array_equal(net.layer[0].blobs[0].data, [1, 2, 3, 4])


def test_image_and_window_data_transform_params_move():
    net = upgrade_net(
        parse("""
        layers { name: "img" type: IMAGE_DATA image_data_param { source: "l.txt" mirror: false
                                                                 new_height: 256 } }
        layers { name: "win" type: WINDOW_DATA window_data_param { crop_size: 227 scale: 2 } }
    """)
    )
    img, win = net.layer
    assert img.transform_param.has("mirror") and img.transform_param.mirror is False
    assert not img.image_data_param.has("mirror") and img.image_data_param.new_height == 256
    assert win.transform_param.crop_size == 227 and win.transform_param.scale == 2
    assert not win.window_data_param.has("crop_size")


def test_input_dim_needs_four_per_input():
    net = upgrade_net(parse("input: 'a' input: 'b' input_dim: [1, 2, 3, 4, 5, 6, 7, 8]"))
    assert [list(s.dim) for s in net.input_shape] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert not net.has("input_dim")
    with pytest.raises(
        PrototxtError,
        match=r"x.prototxt:1:12: the net has 1 input\(s\) and 3 "
        r"input_dim values",
    ):
        upgrade_net(parse("input: 'a' input_dim: 1 input_dim: 2 input_dim: 3", filename="x.prototxt"))


def test_mixing_layer_and_layers_is_an_error():
    with pytest.raises(
        PrototxtError,
        match=r"mix.prototxt:2:1: the net mixes 'layer' .* and "
        r"'layers'",
    ):
        upgrade_net(parse('layer { name: "a" type: "ReLU" }\nlayers { name: "b" type: RELU }', filename="mix.prototxt"))


def test_v0_layers_are_refused_with_an_explanation():
    with pytest.raises(PrototxtError, match="V0 layer format"):
        upgrade_net(parse('layers { layer { name: "conv1" type: "conv" num_output: 3 } }'))


def test_batch_norm_params_are_frozen():
    net = upgrade_net(
        parse('layer { name: "bn" type: "BatchNorm" param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }')
    )
    assert [(p.lr_mult, p.decay_mult) for p in net.layer[0].param] == [(0, 0)] * 3


@pytest.mark.parametrize(
    "old, new",
    [
        ("SGD", "SGD"),
        ("NESTEROV", "Nesterov"),
        ("ADAGRAD", "AdaGrad"),
        ("RMSPROP", "RMSProp"),
        ("ADADELTA", "AdaDelta"),
        ("ADAM", "Adam"),
    ],
)
def test_solver_type_enum_becomes_type_string(old, new):
    solver = upgrade_solver(parse(f"base_lr: 0.01 solver_type: {old}", "SolverParameter"))
    assert solver.type == new and not solver.has("solver_type")
    assert solver.base_lr == 0.01


def test_solver_with_both_types_is_an_error():
    with pytest.raises(PrototxtError, match=r"s.prototxt:1:1: the solver gives both solver_type"):
        upgrade_solver(parse('solver_type: ADAM type: "Adam"', "SolverParameter", filename="s.prototxt"))
    current = parse('type: "Adam"', "SolverParameter")
    assert upgrade_solver(current) == current
