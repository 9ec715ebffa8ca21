"""The binary wire format (caffemodel), and random messages through text and wire."""

import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minicaffe.errors import PrototxtError
from minicaffe.proto import SCHEMA, Message, decode, encode, parse, to_text
from minicaffe.proto.schema import INT_RANGES
from minicaffe.proto.wire import encode_varint


def test_varints_known_bytes():
    assert encode_varint(0) == b"\x00"
    assert encode_varint(1) == b"\x01"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(2**64 - 1) == b"\xff" * 9 + b"\x01"


def test_scalars_encode_to_known_bytes():
    # field 1 (num_output, uint32) = 150: key 0x08, varint 0x96 0x01
    assert encode(Message("ConvolutionParameter", num_output=150)) == b"\x08\x96\x01"
    # a negative int32 is a 10-byte varint (64-bit two's complement)
    assert encode(Message("FillerParameter", sparse=-1)) == b"\x38" + b"\xff" * 9 + b"\x01"
    # float (wire type 5) and string (wire type 2)
    assert encode(Message("FillerParameter", std=0.5)) == b"\x35" + struct.pack("<f", 0.5)
    assert encode(Message("FillerParameter", type="xavier")) == b"\x0a\x06xavier"
    # an enum is a varint of its number
    assert encode(Message("PoolingParameter", pool="AVE")) == b"\x08\x01"
    # BlobShape.dim is packed: one LEN record with the varints back to back
    assert encode(Message("BlobShape", dim=[2, 300])) == b"\x0a\x03\x02\xac\x02"
    # ConvolutionParameter.pad is not packed: one record per element
    assert encode(Message("ConvolutionParameter", pad=[1, 2])) == b"\x18\x01\x18\x02"


def test_negative_ints_round_trip():
    msg = Message("NetParameter", input_dim=[-1, 0, 2**31 - 1, -(2**31)])
    msg.state.level = -7
    solver = Message("SolverParameter", random_seed=-(2**63), device_id=-5)
    assert decode(encode(msg)) == msg
    assert decode(encode(solver), "SolverParameter") == solver
    assert decode(encode(solver), "SolverParameter").random_seed == -(2**63)


def test_packed_and_unpacked_are_both_accepted():
    packed = b"\x0a\x03\x02\xac\x02"  # dim: [2, 300] packed
    unpacked = b"\x08\x02\x08\xac\x02"  # the same, one record each
    assert decode(packed, "BlobShape").dim == [2, 300]
    assert decode(unpacked, "BlobShape").dim == [2, 300]
    assert decode(packed + unpacked, "BlobShape").dim == [2, 300, 2, 300]
    floats = np.array([1.5, -2.0, 3.25], np.float32)
    packed_f = b"\x2a\x0c" + floats.tobytes()  # BlobProto.data, field 5
    unpacked_f = b"".join(b"\x2d" + struct.pack("<f", v) for v in floats)
    for data in (packed_f, unpacked_f):
        blob = decode(data, "BlobProto")
        assert blob.data.dtype == np.float32
        np.testing.assert_array_equal(blob.data, floats)
    # Datum.float_data is not packed; an encoder writes one record per value
    datum = Message("Datum", float_data=[1.0, 2.0])
    assert encode(datum) == b"\x35" + struct.pack("<f", 1) + b"\x35" + struct.pack("<f", 2)
    assert decode(encode(datum), "Datum") == datum
    # double_data (field 8) decodes to float64
    dd = decode(b"\x42\x10" + np.array([1.0, 2.0]).tobytes(), "BlobProto")
    assert dd.double_data.dtype == np.float64 and list(dd.double_data) == [1.0, 2.0]


def test_unknown_fields_are_skipped():
    known = encode(Message("FillerParameter", type="gaussian", std=0.01))
    junk = (
        encode_varint(99 << 3 | 0)
        + encode_varint(12345)  # varint
        + encode_varint(98 << 3 | 1)
        + b"\x00" * 8  # 64-bit
        + encode_varint(97 << 3 | 2)
        + b"\x03abc"  # length-delimited
        + encode_varint(96 << 3 | 5)
        + b"\x00" * 4
    )  # 32-bit
    assert decode(junk + known + junk, "FillerParameter") == decode(known, "FillerParameter")


def test_singular_fields_last_wins_and_messages_merge():
    a = encode(Message("LayerParameter", name="a", convolution_param={"num_output": 3}))
    b = encode(Message("LayerParameter", name="b", convolution_param={"kernel_size": [5]}))
    merged = decode(a + b, "LayerParameter")
    assert merged.name == "b"
    assert merged.convolution_param.num_output == 3
    assert merged.convolution_param.kernel_size == [5]


def make_caffemodel_net(rng):
    net = parse("""
        name: "tiny"
        layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
                convolution_param { num_output: 4 kernel_size: 3 } }
        layer { name: "ip1" type: "InnerProduct" bottom: "conv1" top: "ip1"
                inner_product_param { num_output: 10 } }
    """)
    for layer, shapes in zip(net.layer, [[(4, 3, 3, 3), (4,)], [(10, 64), (10,)]]):
        for shape in shapes:
            blob = layer.add("blobs")
            blob.shape.dim.extend(shape)
            blob.data = rng.standard_normal(shape).astype(np.float32)
    return net


def test_hand_built_caffemodel_round_trips(rng):
    net = make_caffemodel_net(rng)
    data = encode(net)
    back = decode(data, filename="tiny.caffemodel")
    assert back == net
    w = back.layer[0].blobs[0]
    assert w.shape.dim == [4, 3, 3, 3]
    assert isinstance(w.data, np.ndarray) and w.data.dtype == np.float32
    np.testing.assert_array_equal(w.data.reshape(4, 3, 3, 3), net.layer[0].blobs[0].data.reshape(4, 3, 3, 3))
    assert encode(back) == data
    assert back.loc() is None  # no text positions for binary input


def test_legacy_v1_caffemodel_decodes(rng):
    net = Message("NetParameter", name="old")
    layer = net.add("layers", name="fc", type="INNER_PRODUCT", bottom=["x"], top=["y"])
    blob = layer.add("blobs", num=1, channels=1, height=2, width=3)
    blob.data = np.arange(6, dtype=np.float32)
    back = decode(encode(net))
    assert back.layers[0].type == "INNER_PRODUCT"
    assert (back.layers[0].blobs[0].height, back.layers[0].blobs[0].width) == (2, 3)
    np.testing.assert_array_equal(back.layers[0].blobs[0].data, np.arange(6))


def test_large_float_blob_decodes_fast_without_copy():
    values = np.random.default_rng(0).standard_normal(15_000_000).astype(np.float32)  # 60 MB
    blob = Message("BlobProto", data=values)
    blob.shape.dim.append(values.size)
    data = encode(blob)
    assert len(data) > 60_000_000
    start = time.perf_counter()
    back = decode(data, "BlobProto")
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"decoding 60 MB took {elapsed:.2f} s"
    assert np.shares_memory(back.data, np.frombuffer(data, np.uint8))  # a view of the input
    np.testing.assert_array_equal(back.data, values)


@pytest.mark.parametrize(
    "cut, words",
    [
        (1, "truncated input: a varint runs past the end of its message (at byte offset 1)"),
        (3, "truncated input: field 1 ('name') of NetParameter needs 4 bytes but only 1 remain (at byte offset 0)"),
        (12, "truncated input: field 100 ('layer') of NetParameter needs"),
        (-1, "truncated input:"),
    ],
)
def test_truncated_input_names_the_byte_offset(rng, cut, words):
    data = encode(make_caffemodel_net(rng))
    with pytest.raises(PrototxtError) as info:
        decode(data[:cut], filename="tiny.caffemodel")
    assert str(info.value).startswith("tiny.caffemodel: ")
    assert words in str(info.value)
    assert "at byte offset" in str(info.value)


def test_corrupted_input_errors():
    with pytest.raises(PrototxtError, match=r"field number 0 .*at byte offset 0"):
        decode(b"\x00\x01")
    with pytest.raises(PrototxtError, match=r"wire type 7 \(invalid\)"):
        decode(b"\x0f")
    with pytest.raises(
        PrototxtError,
        match=r"field 'name' \(1\) of NetParameter is string "
        r"\(wire type LEN\) but is stored with wire type "
        r"VARINT \(at byte offset 0\)",
    ):
        decode(b"\x08\x01")
    with pytest.raises(PrototxtError, match="not a multiple of 4"):
        decode(b"\x2a\x03abc", "BlobProto")
    with pytest.raises(PrototxtError, match="longer than 10 bytes"):
        decode(b"\x08" + b"\xff" * 11, "ConvolutionParameter")


# ---- random messages through text and wire ---------------------------------------------------


def scalar_values(field):
    t = field.type
    if field.kind == "enum":
        return st.sampled_from(sorted(field.enum_values))
    if t == "bool":
        return st.booleans()
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.one_of(st.integers(lo, hi), st.integers(-3, 300).filter(lambda v: lo <= v))
    if t == "float":
        return st.floats(width=32, allow_nan=True)
    if t == "double":
        return st.floats(allow_nan=True)
    if t == "string":
        return st.text(max_size=8)
    return st.binary(max_size=8)


@st.composite
def messages(draw, type_name, depth=2):
    desc = SCHEMA[type_name]
    fields = desc.fields
    if depth <= 0:
        fields = [f for f in fields if f.kind != "message"]
    chosen = draw(st.lists(st.sampled_from(fields), max_size=4, unique_by=lambda f: f.name)) if fields else []
    msg = Message(type_name)
    for field in chosen:
        if field.kind == "message":
            values = messages(field.type, depth - 1)
        else:
            values = scalar_values(field)
        if field.repeated:
            setattr(msg, field.name, draw(st.lists(values, max_size=3)))
        else:
            setattr(msg, field.name, draw(values))
    return msg


TYPES = [
    "NetParameter",
    "LayerParameter",
    "SolverParameter",
    "BlobProto",
    "V1LayerParameter",
    "ConvolutionParameter",
    "Datum",
    "FillerParameter",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TYPES).flatmap(lambda t: messages(t)))
def test_random_messages_round_trip_through_text(msg):
    text = to_text(msg)
    assert parse(text, msg.type_name) == msg, text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TYPES).flatmap(lambda t: messages(t)))
def test_random_messages_round_trip_through_wire(msg):
    data = encode(msg)
    back = decode(data, msg.type_name)
    assert back == msg, to_text(msg)
    assert encode(back) == data
