"""Helpers for the layer tests: build a layer from prototxt text, make blobs, run it."""

import numpy as np

from minicaffe.blob import Blob
from minicaffe.layer import create_layer
from minicaffe.proto import parse


def make_layer(text, backend, dtype=np.float64, phase="TRAIN"):
    """A layer from the body of a ``layer { ... }`` (name defaults to 'l', type must be given)."""
    if "name:" not in text:
        text = 'name: "l" ' + text
    return create_layer(parse(text, "LayerParameter"), backend, dtype=dtype, phase=phase)


def blob(backend, values, dtype=np.float64):
    """A blob holding ``values`` (an array; its shape is the blob's)."""
    values = np.asarray(values, dtype=dtype)
    b = Blob(values.shape, dtype=dtype, xp=backend.xp)
    b.data[...] = values  # pycaffe's idiom: a host array, synced to the device on first use
    return b


def empty(backend, dtype=np.float64):
    return Blob((), dtype=dtype, xp=backend.xp)


def setup(layer, bottoms, n_tops=1, dtype=np.float64):
    """Set the layer up on ``bottoms`` (Blobs) with ``n_tops`` fresh tops; returns the tops."""
    tops = [empty(layer.backend, dtype) for _ in range(n_tops)]
    layer.setup(bottoms, tops)
    return tops


def forward(layer, bottoms, tops):
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    return [host(layer.backend, t.data) for t in tops]


def run(text, backend, arrays, n_tops=1, dtype=np.float64, phase="TRAIN"):
    """Build, set up and forward a layer on ``arrays``; returns (layer, bottoms, tops, outputs)."""
    layer = make_layer(text, backend, dtype=dtype, phase=phase)
    bottoms = [blob(backend, a, dtype) for a in arrays]
    tops = setup(layer, bottoms, n_tops, dtype)
    outs = forward(layer, bottoms, tops)
    return layer, bottoms, tops, outs


def host(backend, a):
    return np.array(backend.to_host(a))


def away_from(rng, shape, kink=0.0, margin=1e-3, low=-1.0, high=1.0):
    """Uniform values in [low, high) kept at least ``margin`` away from ``kink``."""
    x = rng.uniform(low, high, size=shape)
    near = np.abs(x - kink) < margin
    x[near] = kink + np.where(x[near] >= kink, margin, -margin) * 2
    return x


def distinct(rng, shape, low=-1.0, high=1.0, gap=1e-3):
    """Values with no two closer than ``gap`` (max pooling / Eltwise MAX / ArgMax without ties)."""
    n = int(np.prod(shape))
    span = max(high - low, gap * n * 2)
    values = low + (np.arange(n) + 0.5) * (span / n)
    return rng.permutation(values).reshape(shape)
