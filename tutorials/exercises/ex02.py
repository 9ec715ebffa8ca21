"""Lesson 2 exercises.  Check with ``python -m tutorials.check 02``."""


def split_plan(layers):
    """layers: [(name, [bottom blob names], [top blob names])] in net order.
    Return {(producer layer name, blob name): number of layers reading that version} for every
    blob version read by two or more layers.  A layer whose top has its bottom's name (in place)
    makes a new version of that blob: later readers read the new version."""
    raise NotImplementedError


#: inputs "a" and "b" (2, 8); each: InnerProduct (16 outputs) -> ReLU (in place); the two
#: InnerProducts share weights and bias; an EuclideanLoss between the two towers' outputs.
SIAMESE_MLP = """
name: "siamese_mlp"
"""
