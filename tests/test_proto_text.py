"""The text format (prototxt) parser and printer, the Message API and the schema's defaults."""

import math
import pickle

import numpy as np
import pytest

from minicaffe.errors import PrototxtError
from minicaffe.proto import SCHEMA, Message, parse, parse_file, to_text

LENET = """\
name: "LeNet"   # the classic
layer {
  name: "mnist"
  type: "Data"
  top: "data"
  top: "label"
  include { phase: TRAIN }
  transform_param { scale: 0.00390625 }
  data_param { source: "examples/mnist/mnist_train_lmdb" batch_size: 64 backend: LMDB }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param { lr_mult: 1 }
  param { lr_mult: 2 }
  convolution_param {
    num_output: 20
    kernel_size: 5
    stride: 1
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layer {
  name: "pool1"
  type: "Pooling"
  bottom: "conv1"
  top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "ip2"
  bottom: "label"
  loss_weight: 1.0
}
"""


def round_trip(msg):
    text = to_text(msg)
    back = parse(text, msg.type_name)
    assert back == msg, text
    assert to_text(back) == text
    return back


# ---- parsing -------------------------------------------------------------------------------


def test_lenet_parses_and_reads_like_protobuf():
    net = parse(LENET, filename="lenet.prototxt")
    assert net.name == "LeNet"
    assert [l.name for l in net.layer] == ["mnist", "conv1", "pool1", "loss"]
    data, conv, pool, loss = net.layer
    assert data.top == ["data", "label"]
    assert data.include[0].phase == "TRAIN"
    assert data.data_param.backend == "LMDB"
    assert data.transform_param.scale == 0.00390625
    assert [p.lr_mult for p in conv.param] == [1.0, 2.0]
    assert conv.convolution_param.kernel_size == [5]
    assert conv.convolution_param.weight_filler.type == "xavier"
    assert conv.convolution_param.bias_term is True  # default
    assert pool.pooling_param.pool == "MAX"
    assert loss.loss_weight == [1.0]
    round_trip(net)


def test_round_trip_of_every_value_kind():
    net = parse(r"""
        name: 'quotes "inside"\n\ttab' force_backward: true debug_info: False
        state { phase: TEST level: -3 stage: "a" stage: "b" }
        input: "data" input_shape { dim: [1, 3, 0x10, 017] }
        layer { name: "x" type: "Python" python_param { param_str: "{'k': 1}\\" } }
        layer { name: "y" loss_weight: [.5, 1e-4, -2.5e+3, 1.0f, inf, -inf]
                param { lr_mult: 0 share_mode: PERMISSIVE } propagate_down: [t, f, 1, 0] }
    """)
    assert net.name == 'quotes "inside"\n\ttab'
    assert net.force_backward is True and net.debug_info is False
    assert net.state.level == -3 and net.state.stage == ["a", "b"]
    assert net.input_shape[0].dim == [1, 3, 16, 15]
    assert net.layer[0].python_param.param_str == "{'k': 1}\\"
    lw = net.layer[1].loss_weight
    assert lw[:4] == [0.5, 1e-4, -2500.0, 1.0] and lw[4] == math.inf and lw[5] == -math.inf
    assert net.layer[1].propagate_down == [True, False, True, False]
    round_trip(net)


def test_syntax_variants_give_the_same_message():
    plain = parse('layer { name: "a" convolution_param { num_output: 2 pad: 1 pad: 2 } }')
    for variant in [
        'layer: { name: "a" convolution_param: { num_output: 2 pad: [1, 2] } }',
        'layer < name: "a"; convolution_param < num_output: 2, pad: 1; pad: 2 > >',
        'layer {name:"a"convolution_param{num_output:2 pad:1 pad:2}}',
        '# comment\nlayer {\n  name: "a"  # trailing\n  convolution_param {\n'
        "    num_output: 2\n    pad: 1 pad: 2 } }\n",
    ]:
        assert parse(variant) == plain, variant


def test_strings_concatenate_and_unescape():
    msg = parse(r"""name: "con" 'cat' "\x41\101\u00e9\"\'\\\n" """)
    assert msg.name == "concatAA\u00e9\"'\\\n"
    round_trip(msg)


def test_numbers_bools_and_enums_by_number():
    lp = parse(
        "pooling_param { pool: 1 } relu_param { negative_slope: -0.1 } "
        "inner_product_param { bias_term: True num_output: 0x0A } "
        "batch_norm_param { eps: 1e-5 use_global_stats: f } "
        "power_param { power: -inf shift: nan }",
        "LayerParameter",
    )
    assert lp.pooling_param.pool == "AVE"
    assert lp.relu_param.negative_slope == pytest.approx(-0.1)
    assert lp.inner_product_param.num_output == 10
    assert lp.batch_norm_param.use_global_stats is False
    assert lp.power_param.power == -math.inf and math.isnan(lp.power_param.shift)
    round_trip(lp)


def test_solver_parses():
    solver = parse(
        """
        net: "examples/mnist/lenet_train_test.prototxt"
        test_iter: 100 test_interval: 500
        base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005
        lr_policy: "inv" gamma: 0.0001 power: 0.75
        display: 100 max_iter: 10000 snapshot: 5000 snapshot_prefix: "examples/mnist/lenet"
        solver_mode: CPU
    """,
        "SolverParameter",
    )
    assert solver.base_lr == 0.01 and solver.lr_policy == "inv"
    assert solver.test_iter == [100] and solver.solver_mode == "CPU"
    assert solver.type == "SGD" and solver.snapshot_format == "BINARYPROTO"
    round_trip(solver)


def test_printer_is_caffe_style():
    net = Message("NetParameter", name="n")
    layer = net.add("layer", name="ip", type="InnerProduct", bottom=["data"], top=["ip"])
    layer.inner_product_param.num_output = 10
    layer.add("param").lr_mult = 1
    assert to_text(net) == (
        'name: "n"\n'
        "layer {\n"
        '  name: "ip"\n'
        '  type: "InnerProduct"\n'
        '  bottom: "data"\n'
        '  top: "ip"\n'
        "  param {\n"
        "    lr_mult: 1\n"
        "  }\n"
        "  inner_product_param {\n"
        "    num_output: 10\n"
        "  }\n"
        "}\n"
    )


def test_float_fields_print_their_shortest_float32_text():
    f = Message("FillerParameter", std=np.float32(0.01).item(), value=1e-8, min=-0.0)
    text = to_text(f)
    assert "std: 0.01\n" in text and "value: 1e-08\n" in text
    assert parse(text, "FillerParameter") == f


# ---- errors: file:line:column and what was expected / found -----------------------------------


def error_of(text, type_name="NetParameter", filename="lenet.prototxt"):
    with pytest.raises(PrototxtError) as info:
        parse(text, type_name, filename=filename)
    return info.value


def test_error_missing_colon():
    e = error_of('layer {\n  name: "c"\n  convolution_param {\n    num_output 3\n  }\n}\n')
    assert (e.filename, e.line, e.column) == ("lenet.prototxt", 4, 16)
    assert str(e) == ("lenet.prototxt:4:16: expected ':' or '{' after field name 'num_output', found '3'")


def test_error_unknown_field_lists_known_fields_and_suggests():
    e = error_of('layer {\n  nmae: "conv1"\n}')
    assert (e.line, e.column) == (2, 3)
    msg = str(e)
    assert "unknown field 'nmae' in LayerParameter" in msg
    assert "did you mean 'name'?" in msg
    assert "Known fields of LayerParameter:" in msg and "convolution_param" in msg


def test_error_unknown_enum_value_lists_values():
    e = error_of("layer { pooling_param {\n pool: MAXX } }")
    assert (e.line, e.column) == (2, 8)
    assert "unknown value 'MAXX' for field 'pool'" in str(e)
    assert "did you mean 'MAX'?" in str(e)
    assert "Known values: AVE, MAX, STOCHASTIC" in str(e)


@pytest.mark.parametrize(
    "text, column, words",
    [
        (
            'convolution_param { num_output: "ten" }',
            33,
            "expected an integer for field 'num_output' (uint32), found string \"ten\"",
        ),
        ("convolution_param { num_output: 1.5 }", 33, "expected an integer"),
        ("convolution_param { num_output: -1 }", 34, "value -1 is out of range for field 'num_output' (uint32)"),
        ("convolution_param { bias_term: 2 }", 32, "expected true or false for field 'bias_term'"),
        (
            "type: Convolution",
            7,
            "expected a quoted string for field 'type' (string), found "
            "'Convolution' (strings are quoted: \"Convolution\")",
        ),
        ("param { lr_mult: fast }", 18, "expected a number for field 'lr_mult' (float)"),
        ('pooling_param { pool: "MAX" }', 23, "expected an enum value name for field 'pool'"),
        ("pooling_param { pool: 7 }", 23, "7 is not the number of any value of field 'pool'"),
        ("convolution_param { num_output: 3abc }", 33, "invalid number '3abc'"),
        ("name: @", 7, "unexpected character '@'"),
        ('name: "a\\qb"', 7, "unknown escape sequence '\\q'"),
        ("convolution_param { num_output: [1, 2] }", 33, "field 'num_output' of ConvolutionParameter is not repeated"),
        ("convolution_param { pad: [1 2] }", 29, "expected ',' or ']' in the list of 'pad', found '2'"),
        (
            "convolution_param: 3",
            20,
            "expected '{' to start the ConvolutionParameter of field 'convolution_param', found '3'",
        ),
        ("}", 1, "expected a field name in LayerParameter, found '}'"),
    ],
)
def test_error_wrong_value(text, column, words):
    e = error_of(text, "LayerParameter", filename="net.prototxt")
    assert (e.filename, e.line, e.column) == ("net.prototxt", 1, column), str(e)
    assert words in str(e)
    assert str(e).startswith(f"net.prototxt:1:{column}: ")


def test_error_unterminated_string():
    e = error_of('name: "LeNet\nlayer {}')
    assert (e.line, e.column) == (1, 7)
    assert "unterminated string" in str(e)


def test_error_unterminated_message_names_where_it_opened():
    e = error_of('layer {\n  name: "a"\n  convolution_param {\n    num_output: 3\n}\n')
    assert (e.line, e.column) == (6, 1)  # at the end of the file
    assert "unterminated message: expected '}' to close the LayerParameter opened at line 1" in str(e)
    assert "found end of file" in str(e)


def test_error_duplicate_singular_field_names_both_lines():
    e = error_of('layer {\n  name: "a"\n  type: "ReLU"\n  name: "b"\n}')
    assert (e.line, e.column) == (4, 3)
    assert "duplicate field 'name' in LayerParameter (first set at line 2, column 3)" in str(e)
    assert "not a repeated field" in str(e)
    e = error_of("layer { convolution_param { } convolution_param { } }")
    assert "duplicate field 'convolution_param'" in str(e)


def test_error_without_filename_says_string():
    with pytest.raises(PrototxtError, match=r"^<string>:1:6: "):
        parse("name }")


def test_parse_file(tmp_path):
    path = tmp_path / "lenet.prototxt"
    path.write_text(LENET)
    net = parse_file(path)
    assert net == parse(LENET)
    assert net.layer[1].loc() == (str(path), 11, 1)
    assert net.layer[1].loc("type") == (str(path), 13, 3)
    assert net.loc("name") == (str(path), 1, 1)
    with pytest.raises(PrototxtError, match="no_such.prototxt: cannot read NetParameter file"):
        parse_file(tmp_path / "no_such.prototxt")
    (tmp_path / "bad.prototxt").write_text("layer {\n  name: 3\n}\n")
    with pytest.raises(PrototxtError, match=r"bad.prototxt:2:9: expected a quoted string"):
        parse_file(tmp_path / "bad.prototxt")


# ---- defaults (caffe.proto's [default = ...], else proto2 zero defaults) ---------------------


@pytest.mark.parametrize(
    "type_name, field, value",
    [
        ("PoolingParameter", "pool", "MAX"),
        ("PoolingParameter", "stride", 1),
        ("PoolingParameter", "round_mode", "CEIL"),
        ("ConvolutionParameter", "bias_term", True),
        ("ConvolutionParameter", "group", 1),
        ("ConvolutionParameter", "axis", 1),
        ("ConvolutionParameter", "engine", "DEFAULT"),
        ("LRNParameter", "local_size", 5),
        ("LRNParameter", "alpha", 1.0),
        ("LRNParameter", "beta", 0.75),
        ("LRNParameter", "k", 1.0),
        ("LRNParameter", "norm_region", "ACROSS_CHANNELS"),
        ("SoftmaxParameter", "axis", 1),
        ("InnerProductParameter", "axis", 1),
        ("InnerProductParameter", "transpose", False),
        ("FillerParameter", "type", "constant"),
        ("FillerParameter", "std", 1.0),
        ("FillerParameter", "max", 1.0),
        ("FillerParameter", "sparse", -1),
        ("FillerParameter", "variance_norm", "FAN_IN"),
        ("SolverParameter", "momentum", 0.0),
        ("SolverParameter", "lr_policy", ""),
        ("SolverParameter", "type", "SGD"),
        ("SolverParameter", "solver_mode", "GPU"),
        ("SolverParameter", "random_seed", -1),
        ("SolverParameter", "delta", 1e-8),
        ("SolverParameter", "momentum2", 0.999),
        ("SolverParameter", "clip_gradients", -1.0),
        ("SolverParameter", "regularization_type", "L2"),
        ("SolverParameter", "test_initialization", True),
        ("SolverParameter", "average_loss", 1),
        ("SolverParameter", "iter_size", 1),
        ("NetState", "phase", "TEST"),
        ("NetStateRule", "phase", "TRAIN"),  # proto2: the enum's first value
        ("ParamSpec", "lr_mult", 1.0),
        ("ParamSpec", "decay_mult", 1.0),
        ("LossParameter", "normalization", "VALID"),
        ("DropoutParameter", "dropout_ratio", 0.5),
        ("EltwiseParameter", "operation", "SUM"),
        ("HingeLossParameter", "norm", "L1"),  # first value, number 1
        ("ReductionParameter", "operation", "SUM"),
        ("DataParameter", "backend", "LEVELDB"),
        ("DataParameter", "prefetch", 4),
        ("TransformationParameter", "scale", 1.0),
        ("BatchNormParameter", "moving_average_fraction", 0.999),
        ("BatchNormParameter", "eps", 1e-5),
        ("ELUParameter", "alpha", 1.0),
        ("ExpParameter", "base", -1.0),
        ("FlattenParameter", "end_axis", -1),
        ("ReshapeParameter", "num_axes", -1),
        ("CropParameter", "axis", 2),
        ("WindowDataParameter", "crop_mode", "warp"),
        ("ImageDataParameter", "is_color", True),
        ("MVNParameter", "eps", 1e-9),
        ("V0LayerParameter", "biasterm", True),
        ("V1LayerParameter", "type", "NONE"),
        ("BlobProto", "num", 0),
        ("NetParameter", "name", ""),
        ("Datum", "data", b""),
    ],
)
def test_defaults(type_name, field, value):
    msg = Message(type_name)
    got = getattr(msg, field)
    assert got == value and type(got) is type(value), (type_name, field, got)
    assert not msg.has(field)


def test_schema_covers_caffe_proto():
    layer_params = [f.name for f in SCHEMA["LayerParameter"].fields if f.name.endswith("_param")]
    assert len(layer_params) == 49  # transform_param, loss_param and 47 layer params
    assert SCHEMA["LayerParameter"].field("clip_param").number == 148
    assert SCHEMA["NetParameter"].field("layer").number == 100
    assert SCHEMA["BlobProto"].field("data").packed
    assert not SCHEMA["Datum"].field("float_data").packed
    assert SCHEMA["V1LayerParameter"].field("type").enum_values["CONVOLUTION"] == 4
    assert SCHEMA["PoolingParameter"].field("pool").type == "PoolingParameter.PoolMethod"
    assert SCHEMA["NetState"].field("phase").type == "Phase"
    for name in [
        "SwishParameter",
        "ClipParameter",
        "RecurrentParameter",
        "SolverState",
        "BlobProtoVector",
        "PReLUParameter",
        "SPPParameter",
        "TileParameter",
    ]:
        assert name in SCHEMA


# ---- the Message API --------------------------------------------------------------------------


def test_message_reads_defaults_and_set_values():
    conv = Message("ConvolutionParameter", num_output=64, kernel_size=[3, 5])
    assert conv.type_name == "ConvolutionParameter"
    assert conv.num_output == 64 and conv.kernel_size == [3, 5]
    assert conv.has("num_output") and conv.has("kernel_size") and not conv.has("pad")
    assert conv.pad == [] and not conv.has("pad")
    assert conv.fields() == [("num_output", 64), ("kernel_size", [3, 5])]


def test_repeated_fields_are_live_lists():
    net = Message("NetParameter")
    net.input.append("data")
    net.input += ["label"]
    assert net.input == ["data", "label"] and net.has("input")
    with pytest.raises(TypeError, match=r"NetParameter.input \(string\): expected a str"):
        net.input.append(3)


def test_unset_sub_message_reads_as_default_and_attaches_on_write():
    layer = Message("LayerParameter")
    assert layer.convolution_param.num_output == 0
    assert layer.convolution_param.weight_filler.type == "constant"
    assert not layer.has("convolution_param") and layer.fields() == []
    layer.convolution_param.weight_filler.std = 0.5  # a write two levels down
    assert layer.has("convolution_param")
    assert layer.convolution_param.has("weight_filler")
    assert layer.convolution_param.weight_filler.std == 0.5
    other = Message("LayerParameter")
    other.pooling_param.pad_h = other.pooling_param.pad_h  # writing the default still sets
    assert other.has("pooling_param") and other.pooling_param.has("pad_h")
    third = Message("LayerParameter")
    third.inner_product_param.weight_filler  # read, no write
    assert third == Message("LayerParameter")
    third.data_param.backend = "LMDB"
    assert third.data_param.backend == "LMDB"
    fourth = Message("LayerParameter")
    fourth.convolution_param.kernel_size.append(3)  # appending is a write too
    assert fourth.convolution_param.kernel_size == [3] and fourth.has("convolution_param")


def test_add_get_or_create_clear_copy():
    net = Message("NetParameter")
    layer = net.add("layer", name="ip", type="InnerProduct")
    assert net.layer[0] is layer
    ip = layer.get_or_create("inner_product_param")
    assert layer.has("inner_product_param") and layer.inner_product_param is ip
    ip.num_output = 10
    clone = net.copy()
    assert clone == net
    clone.layer[0].inner_product_param.num_output = 11
    assert net.layer[0].inner_product_param.num_output == 10 and clone != net
    layer.clear("inner_product_param")
    assert not layer.has("inner_product_param")
    assert layer.inner_product_param.num_output == 0
    with pytest.raises(TypeError, match="not a repeated message field"):
        net.add("name")
    with pytest.raises(TypeError, match="not a singular message field"):
        net.get_or_create("layer")
    assert pickle.loads(pickle.dumps(net)) == net


def test_assigning_sub_messages_and_dicts():
    layer = Message("LayerParameter")
    layer.convolution_param = {"num_output": 4, "kernel_size": [3]}
    assert layer.convolution_param.num_output == 4
    layer.param = [Message("ParamSpec", lr_mult=0), {"lr_mult": 2}]
    assert [p.lr_mult for p in layer.param] == [0, 2]
    with pytest.raises(TypeError, match="expected a ConvolutionParameter message"):
        layer.convolution_param = Message("PoolingParameter")


def test_setting_wrong_values_raises_clear_errors():
    conv = Message("ConvolutionParameter")
    with pytest.raises(
        TypeError,
        match=r"ConvolutionParameter.num_output \(uint32\): "
        r"expected an integer, got 'x'",
    ):
        conv.num_output = "x"
    with pytest.raises(ValueError, match=r"-1 is out of range \[0, 4294967295\]"):
        conv.num_output = -1
    with pytest.raises(
        ValueError,
        match=r"unknown value 'FAST' \(did you mean 'CAFFE'\?\)|"
        r"unknown value 'FAST'.*Known values",
    ):
        conv.engine = "FAST"
    conv.engine = 2  # by number, read as the name
    assert conv.engine == "CUDNN"
    with pytest.raises(TypeError, match="expected True or False"):
        conv.bias_term = "yes"
    with pytest.raises(TypeError, match="is repeated: assign a list"):
        conv.kernel_size = "3"
    with pytest.raises(
        AttributeError,
        match=r"message ConvolutionParameter has no field "
        r"'kernal_size' \(did you mean 'kernel_size'\?\)",
    ):
        conv.kernal_size = [3]


def test_unknown_attribute_read_names_type_and_suggests():
    with pytest.raises(AttributeError) as info:
        Message("PoolingParameter").kernelsize
    assert "message PoolingParameter has no field 'kernelsize'" in str(info.value)
    assert "did you mean 'kernel_size'?" in str(info.value)


def test_equality_and_repr():
    a = parse('layer { name: "a" param { lr_mult: 0.1 } }')
    b = Message("NetParameter")
    b.add("layer", name="a").add("param", lr_mult=np.float32(0.1).item())  # float32-rounded
    assert a == b  # float fields compare at float32 precision
    assert a != Message("NetParameter") and a != Message("SolverParameter")
    assert repr(a) == 'NetParameter {\n  layer {\n    name: "a"\n    param {\n      lr_mult: 0.1\n    }\n  }\n}'
    assert repr(Message("BlobShape")) == "BlobShape {}"


def test_numpy_values_for_numeric_repeated_fields():
    blob = Message("BlobProto")
    blob.data = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert blob.data.dtype == np.float32 and blob.data.shape == (6,)
    blob.shape.dim.extend(np.array([2, 3]))
    assert blob.shape.dim == [2, 3]
    assert blob == round_trip(blob)
