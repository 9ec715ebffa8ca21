"""The protobuf binary wire format (a ``.caffemodel``, a ``.binaryproto``), from scratch.

A binary message is a flat sequence of *records*, one per field value, in any order::

    record  = key payload
    key     = varint( field_number << 3 | wire_type )

The wire type says how long the payload is -- it is all a reader needs to skip a field it does
not know, which is how old and new programs read each other's files:

==========  =====================  ==========================================================
wire type   payload                used for
==========  =====================  ==========================================================
0 VARINT    a varint               int32 int64 uint32 uint64 bool enum
1 I64       8 bytes little-endian  double
2 LEN       varint length + bytes  string bytes, sub-messages, *packed* repeated numbers
5 I32       4 bytes little-endian  float
==========  =====================  ==========================================================

A **varint** stores an unsigned integer 7 bits per byte, least significant group first; the
high bit of each byte says "more bytes follow" (300 = 0b10_0101100 -> ``AC 02``).  int32 and
int64 are stored as their 64-bit two's complement, so a negative number takes 10 bytes (only
``sint32``/``sint64`` use zigzag, and caffe.proto has none).

A repeated field is either one record per element, or -- when ``[packed = true]`` -- a single
LEN record whose payload is the elements back to back.  A reader must accept both.  A trained
Caffe net is a ``NetParameter`` whose layers hold ``BlobProto`` blobs, and a blob's
``data`` is one packed run of float32s: ``np.frombuffer`` turns it into an array without a
Python loop (and, for a ``bytes`` input, without a copy: the array is a read-only view).
"""

import struct

import numpy as np

from minicaffe.errors import PrototxtError
from minicaffe.proto.message import NUMPY_DTYPES, Message, RepeatedField
from minicaffe.proto.schema import descriptor

VARINT, I64, LEN, I32 = 0, 1, 2, 5
WIRE_TYPE_NAMES = {0: "VARINT", 1: "I64", 2: "LEN", 3: "SGROUP", 4: "EGROUP", 5: "I32"}

# The wire type of one (unpacked) element of each field type.
_SCALAR_WIRE_TYPE = {
    "int32": VARINT,
    "int64": VARINT,
    "uint32": VARINT,
    "uint64": VARINT,
    "bool": VARINT,
    "double": I64,
    "float": I32,
    "string": LEN,
    "bytes": LEN,
}

# Fixed-width little-endian element types (a packed run of them is one np.frombuffer).
_FIXED = {"float": np.dtype("<f4"), "double": np.dtype("<f8")}

_MASK64 = (1 << 64) - 1


def wire_type_of(field):
    if field.kind == "message":
        return LEN
    if field.kind == "enum":
        return VARINT
    return _SCALAR_WIRE_TYPE[field.type]


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


#: protobuf's own default recursion limit; caffe.proto has no recursive message, so real files
#: nest a few levels (NetParameter > LayerParameter > ConvolutionParameter > FillerParameter).
MAX_DEPTH = 100


def message_budget(n_bytes):
    """How many messages a buffer of ``n_bytes`` may decode into.

    A message costs a few hundred bytes of Python objects, while an empty sub-message costs 2-3
    bytes of input, so without a budget a 1 MB file of empty records would take ~100 MB.  Real
    files hold far fewer messages than one per 8 bytes (a caffemodel's bytes are float data).
    """
    return 10_000 + n_bytes // 8


class Decoder:
    """Reads messages out of one buffer; every position is an absolute byte offset in it.

    Bounds, so that a small hostile file cannot take much memory or time: sub-messages nest at
    most ``max_depth`` levels, and at most ``max_messages`` messages are built (default
    :func:`message_budget` of the buffer's length).  Each is a PrototxtError naming the offset.
    """

    def __init__(self, data, filename=None, max_depth=MAX_DEPTH, max_messages=None):
        if not isinstance(data, (bytes, bytearray)):
            data = memoryview(data).cast("B")  # any other bytes-like object
        self.data, self.filename = data, filename
        self.max_depth = max_depth
        self.max_messages = message_budget(len(data)) if max_messages is None else max_messages
        self.depth, self.messages = 0, 0

    def error(self, message, offset):
        return PrototxtError(f"{message} (at byte offset {offset})", self.filename)

    def read_varint(self, pos, end):
        """(value, position after it) of the varint at ``pos``."""
        data, result, shift, start = self.data, 0, 0, pos
        while True:
            if pos >= end:
                raise self.error("truncated input: a varint runs past the end of its message", start)
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise self.error("corrupted input: a varint longer than 10 bytes", start)

    def read_record(self, pos, end, desc):
        """One record at ``pos``: (field number, wire type, payload, position after it).

        The payload is the value for a VARINT, else the (start, end) of its bytes: its extent is
        known from the wire type alone, which is what lets a reader skip what it does not need.
        """
        record_start = pos
        key, pos = self.read_varint(pos, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise self.error(f"corrupted input: field number 0 in a {desc.name}", record_start)
        if wire_type == VARINT:
            payload, pos = self.read_varint(pos, end)
            return number, wire_type, payload, pos
        if wire_type in (I64, I32, LEN):
            if wire_type == LEN:
                size, pos = self.read_varint(pos, end)
            else:
                size = 8 if wire_type == I64 else 4
            if pos + size > end:
                known = desc.by_number.get(number)
                what = f"field {number}" + (f" ('{known.name}')" if known else "")
                raise self.error(
                    f"truncated input: {what} of {desc.name} needs {size} bytes but only {end - pos} remain",
                    record_start,
                )
            return number, wire_type, (pos, pos + size), pos + size
        raise self.error(
            f"corrupted input: wire type {wire_type} "
            f"({WIRE_TYPE_NAMES.get(wire_type, 'invalid')}) for field "
            f"{number} of {desc.name} is not supported",
            record_start,
        )

    def records(self, type_name, start, end):
        """Walk the records of a ``type_name`` in ``data[start:end]`` without building messages:
        yields (field, wire type, payload, record start); ``field`` is None for unknown numbers."""
        desc = descriptor(type_name)
        pos = start
        while pos < end:
            record_start = pos
            number, wire_type, payload, pos = self.read_record(pos, end, desc)
            yield desc.by_number.get(number), wire_type, payload, record_start

    def decode_message(self, type_name, start, end):
        """The message of ``type_name`` stored in ``data[start:end]``."""
        self.messages += 1
        if self.messages > self.max_messages:
            raise self.error(
                f"corrupted input: more than {self.max_messages} messages in {len(self.data)} bytes "
                f"(a file of empty records?)",
                start,
            )
        if self.depth >= self.max_depth:
            raise self.error(f"corrupted input: messages nested deeper than {self.max_depth} levels", start)
        self.depth += 1
        try:
            return self._decode_message(type_name, start, end)
        finally:
            self.depth -= 1

    def _decode_message(self, type_name, start, end):
        desc = descriptor(type_name)
        msg = Message(type_name)
        values = msg._values
        numbers = {}  # repeated numeric field name -> list of chunks
        pos = start
        while pos < end:
            record_start = pos
            number, wire_type, payload, pos = self.read_record(pos, end, desc)
            field = desc.by_number.get(number)
            if field is None:
                continue  # a field this schema does not know: skip it
            # -- interpret it --
            expected = wire_type_of(field)
            packed = field.repeated and wire_type == LEN and expected != LEN
            if wire_type != expected and not packed:
                raise self.error(
                    f"corrupted input: field '{field.name}' ({number}) of {type_name} is "
                    f"{field.type_label} (wire type {WIRE_TYPE_NAMES[expected]}) but is "
                    f"stored with wire type {WIRE_TYPE_NAMES[wire_type]}",
                    record_start,
                )
            if field.kind == "message":
                sub = self.decode_message(field.type, *payload)
                if field.repeated:
                    list.append(msg._repeated(field.name), sub)
                elif field.name in values:  # protobuf merges a repeated singular message
                    merge(values[field.name], sub)
                else:
                    values[field.name] = sub
                continue
            if packed:
                chunk = self.unpack(field, *payload)
            elif wire_type == LEN:
                chunk = bytes(self.data[payload[0] : payload[1]])
                if field.type == "string":
                    chunk = chunk.decode("utf-8", "surrogateescape")
            elif wire_type == VARINT:
                chunk = self.from_varint(field, payload)
            else:
                chunk = np.frombuffer(self.data, _FIXED[field.type], 1, payload[0])[0].item()
            if field.kind == "enum" and chunk is None:
                continue  # an enum number this schema does not know
            if not field.repeated:
                values[field.name] = chunk
            else:
                chunks = numbers.setdefault(field.name, [])
                if packed:
                    chunks.append(chunk)
                elif chunks and isinstance(chunks[-1], list):
                    chunks[-1].append(chunk)  # unpacked elements gather in a list
                else:
                    chunks.append([chunk])
        for name, chunks in numbers.items():
            field = desc.by_name[name]
            if field.type in _FIXED:
                arrays = [np.asarray(c, dtype=NUMPY_DTYPES[field.type]) for c in chunks]
                values[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            else:
                lst = RepeatedField(msg, field)
                for c in chunks:
                    list.extend(lst, c)
                values[name] = lst
        return msg

    def unpack(self, field, start, end):
        """The elements of a packed run: an array for float/double, else a list."""
        if field.type in _FIXED:
            dtype = _FIXED[field.type]
            if (end - start) % dtype.itemsize:
                raise self.error(
                    f"corrupted input: packed field '{field.name}' holds "
                    f"{end - start} bytes, not a multiple of {dtype.itemsize}",
                    start,
                )
            return np.frombuffer(self.data, dtype, (end - start) // dtype.itemsize, start)
        out, pos = [], start
        while pos < end:
            value, pos = self.read_varint(pos, end)
            value = self.from_varint(field, value)
            if value is not None:
                out.append(value)
        return out

    @staticmethod
    def from_varint(field, value):
        """A varint's value as ``field``'s type (None for an unknown enum number)."""
        t = field.type
        if field.kind == "enum":
            value &= 0xFFFFFFFF
            if value >= 1 << 31:
                value -= 1 << 32
            return field.enum_names.get(value)
        if t == "bool":
            return value != 0
        if t == "uint32":
            return value & 0xFFFFFFFF
        if t == "uint64":
            return value & _MASK64
        if t == "int32":  # low 32 bits, two's complement
            value &= 0xFFFFFFFF
            return value - (1 << 32) if value >= 1 << 31 else value
        value &= _MASK64  # int64
        return value - (1 << 64) if value >= 1 << 63 else value


def merge(dst, src):
    """protobuf's MergeFrom: src's singular fields overwrite, repeated ones append,
    sub-messages merge."""
    for name, value in src.fields():
        field = dst._desc.by_name[name]
        if field.repeated:
            current = dst._values.get(name)
            if current is None or len(current) == 0:
                dst._values[name] = value
            elif isinstance(current, np.ndarray) or isinstance(value, np.ndarray):
                dtype = NUMPY_DTYPES[field.type]
                dst._values[name] = np.concatenate([np.asarray(current, dtype), np.asarray(value, dtype)])
            else:
                list.extend(current, value)
        elif field.kind == "message" and name in dst._values:
            merge(dst._values[name], value)
        else:
            dst._values[name] = value


def decode(data, type_name="NetParameter", filename=None):
    """The message of ``type_name`` encoded in ``data`` (bytes); PrototxtError with the byte
    offset if it is truncated or corrupted.  Packed float/double fields become numpy arrays
    (read-only views into ``data`` when it is ``bytes``)."""
    decoder = Decoder(data, filename)
    return decoder.decode_message(type_name, 0, len(decoder.data))


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def encode_varint(value):
    """The varint bytes of a non-negative integer below 2**64."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field, wire_type):
    return encode_varint(field.number << 3 | wire_type)


def _varint_of(field, value):
    """The varint encoding of one VARINT-typed element."""
    if field.kind == "enum":
        value = field.enum_values[value]
    elif field.type == "bool":
        value = int(bool(value))
    return encode_varint(int(value) & _MASK64)  # negatives: 64-bit two's complement


def _element(field, value):
    """The payload of one unpacked element (for LEN fields including its length)."""
    wire_type = wire_type_of(field)
    if wire_type == VARINT:
        return _varint_of(field, value)
    if wire_type == I32:
        return struct.pack("<f", value)
    if wire_type == I64:
        return struct.pack("<d", value)
    if field.type == "string":
        value = value.encode("utf-8", "surrogateescape")
    return encode_varint(len(value)) + value


def _encode(msg, chunks):
    """Append the encoding of ``msg`` to the list ``chunks``; return its length in bytes."""
    size = 0
    for name, value in msg.fields():  # in field-number order, like protobuf
        field = msg._desc.by_name[name]
        values = value if field.repeated else [value]
        if field.kind == "message":
            key = _key(field, LEN)
            for sub in values:
                sub_chunks = []
                sub_size = _encode(sub, sub_chunks)
                head = key + encode_varint(sub_size)
                chunks.append(head)
                chunks.extend(sub_chunks)
                size += len(head) + sub_size
        elif field.packed:
            if field.type in _FIXED:
                payload = np.ascontiguousarray(values, dtype=_FIXED[field.type]).tobytes()
            else:
                payload = b"".join(_varint_of(field, v) for v in values)
            head = _key(field, LEN) + encode_varint(len(payload))
            chunks.append(head)
            chunks.append(payload)
            size += len(head) + len(payload)
        else:
            key = _key(field, wire_type_of(field))
            if isinstance(values, np.ndarray):
                values = values.tolist()
            for v in values:
                piece = key + _element(field, v)
                chunks.append(piece)
                size += len(piece)
    return size


def encode(msg):
    """``msg`` in the binary wire format (packed encoding for ``[packed = true]`` fields)."""
    chunks = []
    _encode(msg, chunks)
    return b"".join(chunks)
