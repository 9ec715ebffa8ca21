"""Lesson 2: reference solutions."""


def split_plan(layers):
    producer = {}  # blob name -> the layer that wrote its current version
    readers = {}
    for name, bottoms, tops in layers:
        for b in bottoms:
            if b in producer:
                key = (producer[b], b)
                readers[key] = readers.get(key, 0) + 1
        for t in tops:
            producer[t] = name
    return {k: n for k, n in readers.items() if n > 1}


SIAMESE_MLP = """
name: "siamese_mlp"
input: "a"  input_shape { dim: 2 dim: 8 }
input: "b"  input_shape { dim: 2 dim: 8 }
layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "ha"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu_a" type: "ReLU" bottom: "ha" top: "ha" }
layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "hb"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu_b" type: "ReLU" bottom: "hb" top: "hb" }
layer { name: "loss" type: "EuclideanLoss" bottom: "ha" bottom: "hb" top: "loss" }
"""
