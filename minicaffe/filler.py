"""Fillers: how a parameter blob gets its initial values (Caffe's filler.hpp).

``fill(blob, filler_param)`` reads a FillerParameter message (type, value, min, max, mean, std,
sparse, variance_norm) and writes ``blob.data``.  Random fillers draw from minicaffe.rng, so
``set_random_seed`` makes them reproducible.  Values are drawn in float64 on the host and copied
to the blob's device once.

fan_in = count / shape[0] and fan_out = count / shape[1], as in Caffe (for a conv weight
(out, in/group, kh, kw): fan_in = in/group * kh * kw).
"""

import math

import numpy as np

from .errors import MinicaffeError, did_you_mean
from .rng import get_rng


def _fans(shape):
    count = int(np.prod(shape)) if shape else 1
    if not shape:
        return 1, 1
    fan_in = count // shape[0] if shape[0] else 1
    fan_out = count // shape[1] if len(shape) > 1 and shape[1] else count
    return fan_in, fan_out


def _variance_n(param, shape):
    fan_in, fan_out = _fans(shape)
    norm = param.variance_norm
    if norm == "FAN_OUT":
        return fan_out
    if norm == "AVERAGE":
        return (fan_in + fan_out) / 2.0
    return fan_in


def _constant(param, shape, rng):
    return np.full(shape, param.value)


def _uniform(param, shape, rng):
    return rng.uniform(param.min, param.max, size=shape)


def _gaussian(param, shape, rng):
    values = rng.normal(param.mean, param.std, size=shape)
    if param.sparse >= 0:
        # Caffe: keep each weight with probability sparse / num_outputs (shape[0] of a 2-d blob).
        if len(shape) < 2:
            raise MinicaffeError("gaussian filler with 'sparse' needs a blob of at least 2 axes")
        keep = rng.random(size=shape) < (param.sparse / shape[0])
        values = values * keep
    return values


def _positive_unitball(param, shape, rng):
    values = rng.uniform(0, 1, size=shape).reshape(shape[0] if shape else 1, -1)
    values /= values.sum(axis=1, keepdims=True)
    return values.reshape(shape)


def _xavier(param, shape, rng):
    scale = math.sqrt(3.0 / _variance_n(param, shape))
    return rng.uniform(-scale, scale, size=shape)


def _msra(param, shape, rng):
    std = math.sqrt(2.0 / _variance_n(param, shape))
    return rng.normal(0.0, std, size=shape)


def _bilinear(param, shape, rng):
    """Weights of a bilinear upsampling kernel (for a Deconvolution used as an upsampler)."""
    if len(shape) != 4 or shape[2] != shape[3]:
        raise MinicaffeError(f"bilinear filler needs a 4-d blob with square kernels, got shape {shape}")
    k = shape[3]
    f = math.ceil(k / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    x = np.arange(k)
    w1 = 1 - np.abs(x / f - c)
    return np.broadcast_to(np.outer(w1, w1), shape).copy()


FILLERS = {
    "constant": _constant,
    "uniform": _uniform,
    "gaussian": _gaussian,
    "positive_unitball": _positive_unitball,
    "xavier": _xavier,
    "msra": _msra,
    "bilinear": _bilinear,
}


def fill(blob, param):
    """Fill ``blob.data`` as the FillerParameter ``param`` says."""
    kind = param.type
    fn = FILLERS.get(kind)
    if fn is None:
        raise MinicaffeError(
            f"unknown filler type '{kind}' for blob '{blob.name}'." + did_you_mean(kind, FILLERS, "fillers")
        )
    values = fn(param, tuple(blob.shape), get_rng())
    blob.data = values.astype(blob.dtype, copy=False)  # overwrites the host side; synced on first use
