"""Message: a protobuf message that reads like the ones Caffe's Python bindings give you.

    >>> conv = Message("ConvolutionParameter", num_output=64, kernel_size=[3])
    >>> conv.num_output, conv.bias_term, conv.engine     # set, default, enum default
    (64, True, 'DEFAULT')
    >>> conv.stride.append(2)                             # repeated fields are live lists
    >>> conv.weight_filler.type                           # unset sub-message: a default instance
    'constant'
    >>> conv.has("weight_filler")                         # ... and reading it did not set it
    False
    >>> conv.weight_filler.type = "xavier"                # writing into it does
    >>> conv.has("weight_filler")
    True

How a message keeps its values
------------------------------
``_values`` holds the fields that are *set* (name -> value); anything else reads as the
schema's default (see ``schema.py``).  Enum values are their names (``"MAX"``), repeated fields
are lists (``RepeatedField``, a list that checks what is put into it), except repeated numeric
fields decoded from a caffemodel, which are numpy arrays (a blob holds millions of floats).

An unset sub-message reads as a *detached* default instance that remembers its parent; the
first write into it attaches it to the parent (that is what protobuf's own Python messages do).
So ``layer.convolution_param.num_output = 8`` works whether or not ``convolution_param`` was
set, while merely reading ``layer.convolution_param.num_output`` leaves ``layer`` unchanged.

Numbers: a ``float`` field holds a Python float as given (``base_lr: 0.01`` reads 0.01); the
wire format stores it as float32, so ``==`` compares float fields at float32 precision (and
treats NaN as equal to NaN: both print and encode the same).  Arrays decoded from ``bytes`` are
read-only views of the input; ``copy()`` shares them, and assigning a new array replaces them.

Setting a field checks the value against the schema: a wrong type raises TypeError, an
out-of-range integer or unknown enum name raises ValueError, an unknown field AttributeError.
"""

import math

import numpy as np

from minicaffe.proto.schema import INT_RANGES, descriptor, suggest

# numpy dtypes of repeated numeric fields decoded from the wire format.
NUMPY_DTYPES = {"float": np.float32, "double": np.float64}


def check_value(field, value):
    """``value`` converted to what a message stores for one element of ``field``, or raise.

    TypeError: the Python type does not fit (a string for an int field, ...).
    ValueError: the type fits but the value does not (out of range, unknown enum name).
    """
    where = f"{field.message_name}.{field.name} ({field.type_label})"
    t = field.type
    if field.kind == "message":
        if isinstance(value, Message):
            if value.type_name != t:
                raise TypeError(f"{where}: expected a {t} message, got a {value.type_name}")
            return value
        if isinstance(value, dict):
            return Message(t, **value)
        raise TypeError(f"{where}: expected a {t} message (or a dict of its fields), got {value!r}")
    if field.kind == "enum":
        if isinstance(value, str):
            if value not in field.enum_values:
                raise ValueError(f"{where}: unknown value '{value}'" + suggest(value, field.enum_values, "values"))
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if int(value) not in field.enum_names:
                raise ValueError(f"{where}: {value} is not the number of any value; known values: {field.enum_values}")
            return field.enum_names[int(value)]
        raise TypeError(f"{where}: expected an enum value name (a string), got {value!r}")
    if t == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise TypeError(f"{where}: expected True or False, got {value!r}")
    if t in INT_RANGES:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            lo, hi = INT_RANGES[t]
            if not lo <= value <= hi:
                raise ValueError(f"{where}: {value} is out of range [{lo}, {hi}]")
            return int(value)
        raise TypeError(f"{where}: expected an integer, got {value!r}")
    if t in ("float", "double"):
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            return float(value)
        raise TypeError(f"{where}: expected a number, got {value!r}")
    if t == "string":
        if isinstance(value, str):
            return value
        raise TypeError(f"{where}: expected a str, got {value!r}")
    if t == "bytes":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"{where}: expected bytes, got {value!r}")
    raise AssertionError(f"unhandled type {t}")


class RepeatedField(list):
    """The list behind a repeated field: checks each element and tells its message it changed."""

    __slots__ = ("_message", "_field")

    def __init__(self, message, field, items=()):
        super().__init__(check_value(field, v) for v in items)
        self._message, self._field = message, field

    def _changed(self):
        self._message._touch()

    def append(self, value):
        super().append(check_value(self._field, value))
        self._changed()

    def extend(self, values):
        super().extend(check_value(self._field, v) for v in values)
        self._changed()

    def insert(self, index, value):
        super().insert(index, check_value(self._field, value))
        self._changed()

    def __setitem__(self, index, value):
        if isinstance(index, slice):
            value = [check_value(self._field, v) for v in value]
        else:
            value = check_value(self._field, value)
        super().__setitem__(index, value)
        self._changed()

    def __iadd__(self, values):
        self.extend(values)
        return self

    def add(self, **fields):
        """protobuf's ``msg.layer.add(name="conv1")``: append a new sub-message and return it."""
        if self._field.kind != "message":
            raise TypeError(
                f"{self._field.message_name}.{self._field.name} holds {self._field.type} values: use append()"
            )
        sub = Message(self._field.type, **fields)
        self.append(sub)
        return sub

    def __reduce__(self):  # pickles/copies as a plain list
        return (list, (list(self),))


class Message:
    """A protobuf message of type ``type_name`` (a key of ``schema.SCHEMA``)."""

    __slots__ = ("_desc", "_values", "_defaults", "_parent", "_locs")

    def __init__(self, type_name, /, **fields):
        object.__setattr__(self, "_desc", descriptor(type_name))
        object.__setattr__(self, "_values", {})  # set fields: name -> value
        object.__setattr__(self, "_defaults", {})  # detached default sub-messages handed out
        object.__setattr__(self, "_parent", None)  # (message, field name) while detached
        object.__setattr__(self, "_locs", {})  # None / field name -> (file, line, column)
        for name, value in fields.items():
            setattr(self, name, value)

    @property
    def type_name(self):
        return self._desc.name

    # ---- reading and writing fields -------------------------------------------------------
    def _field(self, name):
        try:
            return self._desc.by_name[name]
        except KeyError:
            raise AttributeError(
                f"message {self._desc.name} has no field '{name}'"
                + suggest(name, self._desc.by_name, f"fields of {self._desc.name}")
            ) from None

    def __getattr__(self, name):
        # Only called when ordinary attribute lookup fails, i.e. for field names.
        if name.startswith("_"):
            raise AttributeError(name)
        field = self._field(name)
        values = self._values
        if name in values:
            return values[name]
        if field.repeated:  # a live (empty) list: appending to it sets it
            values[name] = lst = RepeatedField(self, field)
            return lst
        if field.kind == "message":  # a detached default instance
            sub = self._defaults.get(name)
            if sub is None:
                sub = Message(field.type)
                object.__setattr__(sub, "_parent", (self, name))
                self._defaults[name] = sub
            return sub
        return field.default

    def __setattr__(self, name, value):
        field = self._field(name)
        if field.repeated:
            if isinstance(value, np.ndarray) and field.type in NUMPY_DTYPES:
                value = np.asarray(value, dtype=NUMPY_DTYPES[field.type]).reshape(-1)
            elif isinstance(value, (str, bytes, dict, Message)):
                raise TypeError(f"{self.type_name}.{name} is repeated: assign a list")
            else:
                value = RepeatedField(self, field, value)
        else:
            value = check_value(field, value)
            if field.kind == "message" and value._parent is not None:
                value = value.copy()  # someone else's default instance: take a copy
        self._forget_default(name)
        self._values[name] = value
        self._touch()

    def __delattr__(self, name):
        self.clear(name)

    def _forget_default(self, name):
        sub = self._defaults.pop(name, None)
        if sub is not None:
            object.__setattr__(sub, "_parent", None)

    def _touch(self):
        """Called on every write: a detached default instance attaches itself to its parent."""
        if self._parent is not None:
            parent, name = self._parent
            object.__setattr__(self, "_parent", None)
            if parent._defaults.get(name) is self:
                del parent._defaults[name]
                parent._values[name] = self
                parent._touch()

    def _repeated(self, name):
        """The stored list of repeated field ``name`` (created empty if needed); no checks."""
        value = self._values.get(name)
        if value is None:
            value = self._values[name] = RepeatedField(self, self._desc.by_name[name])
        return value

    # ---- the protobuf-like API ------------------------------------------------------------
    def has(self, name):
        """True if singular field ``name`` is set, or repeated field ``name`` is non-empty."""
        field = self._field(name)
        if name not in self._values:
            return False
        return len(self._values[name]) > 0 if field.repeated else True

    def add(self, name, /, **fields):
        """Append a new sub-message to repeated message field ``name`` and return it.
        (``name`` is positional-only, so ``add("layer", name="conv1")`` sets the layer's name.)"""
        field = self._field(name)
        if not (field.repeated and field.kind == "message"):
            raise TypeError(f"{self.type_name}.{name} is not a repeated message field; add() appends to those only")
        sub = Message(field.type, **fields)
        self._repeated(name).append(sub)
        return sub

    def get_or_create(self, name):
        """Singular sub-message ``name``, set to a default instance first if it is unset."""
        field = self._field(name)
        if field.repeated or field.kind != "message":
            raise TypeError(f"{self.type_name}.{name} is not a singular message field")
        if name not in self._values:
            sub = getattr(self, name)  # the detached default, which then attaches
            sub._touch()
        return self._values[name]

    def clear(self, name):
        """Unset field ``name`` (it reads as its default again)."""
        self._field(name)
        self._values.pop(name, None)
        self._forget_default(name)
        self._locs.pop(name, None)

    def fields(self):
        """[(name, value)] of the set fields, in field-number order (protobuf's ListFields)."""
        out = []
        for field in self._desc.fields_by_number:
            value = self._values.get(field.name)
            if value is not None and not (field.repeated and len(value) == 0):
                out.append((field.name, value))
        return out

    def copy(self):
        """A deep copy.  Writable numpy arrays are copied; read-only ones (the blobs decoded
        from a caffemodel) are shared, since nobody can change them."""
        new = Message(self.type_name)
        for name, value in self._values.items():
            field = self._desc.by_name[name]
            if isinstance(value, np.ndarray):
                value = value.copy() if value.flags.writeable else value
            elif field.repeated:
                items = [v.copy() for v in value] if field.kind == "message" else value
                value = RepeatedField(new, field)
                list.extend(value, items)
            elif field.kind == "message":
                value = value.copy()
            new._values[name] = value
        new._locs.update(self._locs)
        return new

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return (_rebuild, (self.type_name, [(n, _plain(v)) for n, v in self.fields()]))

    def loc(self, name=None):
        """(filename, line, column) where this message (or its field ``name``) was written in
        a parsed text file, or None (built in Python, decoded from the wire format)."""
        if name is not None:
            self._field(name)
        return self._locs.get(name)

    # ---- protobuf's Python API, as pycaffe scripts call it -------------------------------------
    # (caffe_pb2.NetParameter() etc. in minicaffe.proto.caffe_pb2 build these messages)
    def SerializeToString(self):
        """The binary wire format (what a .caffemodel holds)."""
        from minicaffe.proto.wire import encode

        return encode(self)

    def ParseFromString(self, data):
        """Replace this message's fields by those decoded from ``data``; returns its length."""
        self.Clear()
        return self.MergeFromString(data)

    def MergeFromString(self, data):
        from minicaffe.proto.wire import decode

        self.MergeFrom(decode(bytes(data), self.type_name))
        return len(data)

    def MergeFrom(self, other):
        """Singular fields of ``other`` overwrite, repeated ones append, sub-messages merge."""
        from minicaffe.proto.wire import merge

        if not isinstance(other, Message) or other.type_name != self.type_name:
            raise TypeError(f"MergeFrom: expected a {self.type_name}, got {other!r:.80}")
        merge(self, other.copy())
        self._touch()

    def CopyFrom(self, other):
        if other is self:
            return
        self.Clear()
        self.MergeFrom(other)

    def Clear(self):
        for name in list(self._values):
            self.clear(name)

    def HasField(self, name):
        if self._field(name).repeated:
            raise ValueError(f"HasField: {self.type_name}.{name} is repeated (protobuf allows singular fields only)")
        return self.has(name)

    def ClearField(self, name):
        self.clear(name)

    def ListFields(self):
        """[(field descriptor, value)] of the set fields (``descriptor.name`` is the field's name)."""
        return [(self._desc.by_name[name], value) for name, value in self.fields()]

    def ByteSize(self):
        return len(self.SerializeToString())

    def IsInitialized(self):
        return True  # caffe.proto has no required field that minicaffe needs

    def __str__(self):
        """The text format, as protobuf's ``str(msg)``: what ``f.write(str(net))`` saves and
        minicaffe's parser (and Caffe's) reads back."""
        from minicaffe.proto.text_format import to_text

        return to_text(self)

    # ---- comparison and display -----------------------------------------------------------
    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        if self.type_name != other.type_name:
            return False
        mine, theirs = dict(self.fields()), dict(other.fields())
        if mine.keys() != theirs.keys():
            return False
        for name, a in mine.items():
            field = self._desc.by_name[name]
            b = theirs[name]
            if field.repeated:
                if len(a) != len(b):
                    return False
                if field.type in NUMPY_DTYPES:
                    dtype = NUMPY_DTYPES[field.type]
                    if not np.array_equal(np.asarray(a, dtype), np.asarray(b, dtype), equal_nan=True):
                        return False
                elif not all(_same(field, x, y) for x, y in zip(a, b)):
                    return False
            elif not _same(field, a, b):
                return False
        return True

    __hash__ = None  # mutable: not hashable

    def __repr__(self):
        from minicaffe.proto.text_format import to_text

        body = to_text(self)
        if not body:
            return f"{self.type_name} {{}}"
        return f"{self.type_name} {{\n" + "".join("  " + line + "\n" for line in body.splitlines()) + "}"

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._desc.by_name))


def _same(field, a, b):
    """Equality of two element values; float fields compare at float32 precision (what the
    wire format stores) and NaN equals NaN (they print and encode the same)."""
    if field.type in NUMPY_DTYPES:
        if field.type == "float":
            a, b = float(np.float32(a)), float(np.float32(b))
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _plain(value):
    return list(value) if isinstance(value, RepeatedField) else value


def _rebuild(type_name, fields):
    msg = Message(type_name)
    for name, value in fields:
        setattr(msg, name, value)
    return msg
