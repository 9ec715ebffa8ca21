"""pycaffe's ``caffe.proto.caffe_pb2``: a class per message of caffe.proto, built from minicaffe's
own schema (no protobuf package needed).

    from minicaffe.proto import caffe_pb2              # pycaffe: from caffe.proto import caffe_pb2
    from minicaffe.proto import text_format            # pycaffe: from google.protobuf import text_format

    s = caffe_pb2.SolverParameter()
    s.train_net = "train.prototxt"
    s.test_iter.append(100)
    s.solver_mode = caffe_pb2.SolverParameter.CPU      # enum constants are numbers, as in protobuf
    open("solver.prototxt", "w").write(str(s))          # the text format, which minicaffe reads back

    net = caffe_pb2.NetParameter()
    net.ParseFromString(open("lenet.caffemodel", "rb").read())
    text_format.Merge(open("lenet.prototxt").read(), caffe_pb2.NetParameter())

``caffe_pb2.X(**fields)`` returns a :class:`minicaffe.proto.Message` of type X, which has
protobuf's methods (SerializeToString, ParseFromString, CopyFrom, MergeFrom, HasField, ClearField,
ListFields, ``repeated.add()``) and prints as the text format.  ``isinstance(m, caffe_pb2.X)``
works.  Enum values: every value of an enum nested in message X is an attribute of X
(``caffe_pb2.PoolingParameter.MAX == 0``) and top-level ones are module attributes
(``caffe_pb2.TRAIN == 0``).  A field assigned a number reads back as the value's name
(``s.solver_mode`` is ``"CPU"``): minicaffe's messages keep enums as names.
"""

from minicaffe.proto.message import Message
from minicaffe.proto.schema import ENUMS, SCHEMA


class _EnumType:
    """A protobuf enum type: ``Value(name)``, ``Name(number)``, ``keys()``, ``values()``, ``items()``."""

    def __init__(self, name, values):
        self.name, self._values = name, dict(values)
        self._names = {v: k for k, v in self._values.items()}

    def Value(self, name):  # noqa: N802 (protobuf's names)
        return self._values[name]

    def Name(self, number):  # noqa: N802
        return self._names[number]

    def keys(self):
        return list(self._values)

    def values(self):
        return list(self._values.values())

    def items(self):
        return list(self._values.items())

    def __repr__(self):
        return f"<enum {self.name}>"


class _MessageClass(type):
    """Calling the class builds a Message of its type; isinstance checks the type name."""

    def __call__(cls, **fields):
        return Message(cls.type_name, **fields)

    def __instancecheck__(cls, obj):
        return isinstance(obj, Message) and obj.type_name == cls.type_name

    def __repr__(cls):
        return f"<class 'caffe_pb2.{cls.type_name}'>"


def _make(type_name):
    attrs = {"type_name": type_name, "__doc__": f"caffe.proto's {type_name} (a minicaffe.proto.Message)."}
    for qualified, values in ENUMS.items():
        outer, _, inner = qualified.rpartition(".")
        if outer == type_name:
            attrs[inner] = _EnumType(qualified, values)
            attrs.update(values)
    return _MessageClass(type_name, (), attrs)


for _name in SCHEMA:
    globals()[_name] = _make(_name)

for _qualified, _values in ENUMS.items():
    if "." not in _qualified:  # top-level enums: Phase -> TRAIN, TEST
        globals()[_qualified] = _EnumType(_qualified, _values)
        globals().update(_values)

__all__ = sorted(SCHEMA) + [q for q in ENUMS if "." not in q]
