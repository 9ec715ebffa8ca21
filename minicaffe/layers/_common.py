"""Small helpers shared by the layer files (not a layer; the leading underscore keeps the
registry from importing it as one).

- ``has(msg, field)``: was an optional field set in the prototxt (protobuf's ``HasField``)?
- ``shape_str(shape)``: ``(2,3,4,5)``, the form every shape error prints.
- ``axis_index(layer, blob, axis, what, i)``: Caffe's CanonicalAxisIndex with a layer error.
- ``in_place(bottom, top)``: does ``top`` write into ``bottom``'s memory?
- ``fill_blob(blob, filler_param)``: run a FillerParameter on a parameter blob.
- ``loss_normalization`` / ``loss_normalizer``: Caffe's LossParameter normalization rules.
- ``spatial_geometry``: kernel / pad / stride / dilation of Convolution-like layers, every form.
- ``hw_pair``: one (h, w) pair given as ``name`` or as ``name_h`` and ``name_w`` (Pooling uses it).
- ``WorkBuffer``: a flat work array kept across calls (columns, GEMM outputs, lanes' blocks).
- ``add_lane_gradients``: the step plan's lanes' partial weight and bias gradients, summed in.
"""

from .. import filler as _filler


def has(msg, field):
    """True when ``field`` was set explicitly (proto2 presence), False when it reads a default."""
    return msg.has(field)


def shape_str(shape):
    return "(" + ",".join(str(int(d)) for d in shape) + ")"


def axis_index(layer, blob, axis, what="axis", index=0):
    """Canonical (non-negative) index of ``axis`` in ``bottom[index]``; -1 is the last axis."""
    n = blob.num_axes
    if not -n <= axis < n:
        raise layer.error(
            f"{what} {axis} is out of range for bottom[{index}] of shape {shape_str(blob.shape)} ({n} axes)"
        )
    return axis + n if axis < 0 else axis


def in_place(bottom, top):
    """True when ``top`` is ``bottom`` (the Net's in-place form: the same blob name)."""
    return top is bottom or (top.count > 0 and top.shares_data_with(bottom))


def fill_blob(blob, filler_param):
    _filler.fill(blob, filler_param)


def count(shape, start=0, end=None):
    c = 1
    for d in tuple(shape)[start:end]:
        c *= int(d)
    return c


# -- losses -------------------------------------------------------------------------------------
def loss_normalization(layer, default):
    """The normalization mode of a loss layer, with Caffe's legacy ``normalize: bool``.

    ``normalization`` wins when set; else ``normalize: true`` -> VALID, ``normalize: false`` ->
    BATCH_SIZE; else ``default`` (VALID for SoftmaxWithLoss, BATCH_SIZE for
    SigmoidCrossEntropyLoss, as in Caffe).
    """
    lp = layer.param.loss_param
    if has(lp, "normalization"):
        return lp.normalization
    if has(lp, "normalize"):
        return "VALID" if lp.normalize else "BATCH_SIZE"
    return default


def loss_normalizer(mode, outer, inner, valid_count):
    """Caffe's get_normalizer: the number the summed loss is divided by (never below 1)."""
    if mode == "FULL":
        n = outer * inner
    elif mode == "VALID":
        n = outer * inner if valid_count < 0 else valid_count
    elif mode == "BATCH_SIZE":
        n = outer
    elif mode == "NONE":
        n = 1
    else:
        raise ValueError(f"unknown normalization mode {mode!r}")
    return float(max(1, n))


# -- convolution geometry -------------------------------------------------------------------------
def hw_pair(layer, p, name, values, default):
    """``values`` (a repeated field: 1 value for both axes, or h then w) or the ``name_h`` /
    ``name_w`` form, never both; ``default`` when neither is given (None = required)."""
    has_h, has_w = has(p, name + "_h"), has(p, name + "_w")
    values = [int(v) for v in values]
    if has_h or has_w:
        if not (has_h and has_w):
            raise layer.error(f"{name}_h and {name}_w must be given together")
        if values:
            raise layer.error(f"give {name} or {name}_h/{name}_w, not both")
        return int(getattr(p, name + "_h")), int(getattr(p, name + "_w"))
    if not values:
        if default is None:
            raise layer.error(f"{name} size is required ({name}_size: k, or {name}_h and {name}_w)")
        return default, default
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise layer.error(f"{name} given {len(values)} times; 2-d layers take 1 value or 2 (h, w)")


def grouped_gemm(backend, groups, trans_a, trans_b, a, b, beta, c):
    """Caffe's grouped convolution GEMMs: for g < groups, ``c_g = op(a_g) op(b_g) + beta c_g``,
    where x_g is the g-th of ``groups`` equal blocks of x's rows (every operand's first dimension
    is groups x its block)."""
    ra, rb, rc = a.shape[0] // groups, b.shape[0] // groups, c.shape[0] // groups
    for g in range(groups):
        backend.gemm(
            trans_a, trans_b, 1.0, a[g * ra : (g + 1) * ra], b[g * rb : (g + 1) * rb], beta, c[g * rc : (g + 1) * rc]
        )


def spatial_geometry(layer, p):
    """(kh, kw), (ph, pw), (sh, sw), (dh, dw) of a ConvolutionParameter, validated.

    Each of kernel_size / pad / stride / dilation is a repeated field (one value for both
    spatial axes, or h then w); kernel, pad and stride also have the ``_h``/``_w`` form.
    """
    kh, kw = hw_pair(layer, p, "kernel", p.kernel_size, None)
    ph, pw = hw_pair(layer, p, "pad", p.pad, 0)
    sh, sw = hw_pair(layer, p, "stride", p.stride, 1)
    dil = [int(v) for v in p.dilation]
    if len(dil) > 2:
        raise layer.error(f"dilation given {len(dil)} times; 2-d layers take 1 value or 2 (h, w)")
    dh, dw = (1, 1) if not dil else ((dil[0], dil[0]) if len(dil) == 1 else (dil[0], dil[1]))
    for what, a, b in (("kernel size", kh, kw), ("stride", sh, sw), ("dilation", dh, dw)):
        if a <= 0 or b <= 0:
            raise layer.error(f"{what} must be positive, got ({a}, {b})")
    return (kh, kw), (ph, pw), (sh, sw), (dh, dw)


class WorkBuffer:
    """A flat array kept across calls; ``get(shape)`` returns a view, growing only when needed."""

    def __init__(self, xp, dtype):
        self.xp, self.dtype, self.buf, self.block = xp, dtype, None, 0

    def get(self, *shape):
        n = 1
        for d in shape:
            n *= d
        if self.buf is None or self.buf.size < n:
            self.buf = self.xp.empty(n, dtype=self.dtype)
        return self.buf[:n].reshape(shape)

    def reserve(self, parts, block):
        """Room for ``parts`` blocks of ``block`` elements, one per lane (see ``part``)."""
        self.block = block
        if self.buf is None or self.buf.size < parts * block:
            self.buf = self.xp.empty(parts * block, dtype=self.dtype)

    def part(self, k, *shape):
        """Block k of the last ``reserve``, viewed as ``shape``: lane k's buffer."""
        n = 1
        for d in shape:
            n *= d
        return self.buf[k * self.block : k * self.block + n].reshape(shape)

    def attach(self, flat):
        """Use ``flat`` (a placed slice of an arena) as the buffer."""
        self.buf = flat


def add_lane_gradients(layer, buf, parts):
    """The step plan's reduction (``Layer.reduce_lanes``) for a layer with a weight and an optional
    bias: lane k > 0 left its partial dW and db in block k-1 of ``buf`` (dW's values, then db's);
    they are added into the parameter diffs in lane order."""
    W = layer.blobs[0]
    for k in range(1, len(parts)):
        part = buf.part(k - 1, W.count + layer.num_output)
        if layer.param_propagate_down[0]:
            W.dev_flat_diff[...] += part[: W.count]
        if layer.bias_term and layer.param_propagate_down[1]:
            layer.blobs[1].dev_diff[...] += part[W.count :]


# -- neuron layers ----------------------------------------------------------------------------------
from ..layer import Layer  # noqa: E402


class Neuron(Layer):
    """Caffe's NeuronLayer: one bottom, one top of the same shape (in place allowed)."""

    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def reshape(self, bottom, top):
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)
