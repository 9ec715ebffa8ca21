"""Caffe's protobuf formats, from scratch: the schema of caffe.proto, messages, the text format
(.prototxt), the binary wire format (.caffemodel) and the upgrade of legacy nets.

    >>> from minicaffe.proto import parse
    >>> net = parse('name: "tiny" layer { name: "ip" type: "InnerProduct" '
    ...             'inner_product_param { num_output: 10 } }')
    >>> net.layer[0].inner_product_param.num_output, net.layer[0].inner_product_param.bias_term
    (10, True)
"""
from minicaffe.proto.message import Message
from minicaffe.proto.schema import SCHEMA
from minicaffe.proto.text_format import parse, parse_file, to_text

__all__ = ["Message", "parse", "parse_file", "to_text", "SCHEMA"]
