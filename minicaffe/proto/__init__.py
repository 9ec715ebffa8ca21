"""Caffe's protobuf formats, from scratch: the schema of caffe.proto (``schema``), messages
(``message``), the text format of .prototxt files (``text_format``), the binary wire format of
.caffemodel files (``wire``) and the upgrade of legacy definitions (``upgrade``).

    >>> from minicaffe.proto import parse
    >>> net = parse('name: "tiny" layer { name: "ip" type: "InnerProduct" '
    ...             'inner_product_param { num_output: 10 } }')
    >>> net.layer[0].inner_product_param.num_output, net.layer[0].inner_product_param.bias_term
    (10, True)
"""

from minicaffe.proto import caffe_pb2  # pycaffe's caffe.proto.caffe_pb2
from minicaffe.proto.message import Message
from minicaffe.proto.schema import SCHEMA
from minicaffe.proto.text_format import parse, parse_file, to_text
from minicaffe.proto.upgrade import upgrade_net, upgrade_solver
from minicaffe.proto.wire import decode, encode

__all__ = [
    "Message",
    "parse",
    "parse_file",
    "to_text",
    "decode",
    "encode",
    "upgrade_net",
    "upgrade_solver",
    "SCHEMA",
    "caffe_pb2",
]
