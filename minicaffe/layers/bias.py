"""Bias: y = x + b, with b broadcast along some of x's axes (Caffe's BiasLayer).

b is bottom[1] (two-bottom form) or a learned parameter whose shape is x's shape from ``axis``
over ``num_axes`` axes (-1: to the end; 0: a scalar).  x is read as (outer, dim, inner) with
dim = b.count::

    y[o, d, i] = x[o, d, i] + b[d]
    db[d] (+)= sum over o, i of dy[o, d, i]     (accumulates into a parameter, overwrites bottom[1])
    dx = dy
"""

from ..layer import Layer, register
from ._common import axis_index, count, fill_blob, shape_str


def broadcast_dims(layer, x, b_shape, axis_param, what):
    """(outer, dim, inner) of x around the axes a ``what`` blob of ``b_shape`` lines up with."""
    if len(b_shape) == 0:
        return 1, 1, x.count  # a scalar: the axis is irrelevant (Caffe uses 0)
    axis = axis_index(layer, x, axis_param)
    if axis + len(b_shape) > x.num_axes or tuple(x.shape[axis : axis + len(b_shape)]) != tuple(b_shape):
        raise layer.error(
            f"{what} of shape {shape_str(b_shape)} does not match bottom[0] {shape_str(x.shape)} from axis {axis}"
        )
    return count(x.shape, 0, axis), count(b_shape), count(x.shape, axis + len(b_shape))


def param_shape(layer, x, axis_param, num_axes):
    """The learned blob's shape: x's axes from ``axis``, ``num_axes`` of them (-1 = to the end)."""
    if num_axes < -1:
        raise layer.error(f"num_axes must be -1 (to the end) or >= 0, got {num_axes}")
    axis = axis_index(layer, x, axis_param) if x.num_axes else 0
    end = x.num_axes if num_axes == -1 else axis + num_axes
    if end > x.num_axes:
        raise layer.error(
            f"axis {axis_param} with num_axes {num_axes} runs past bottom[0] {shape_str(x.shape)} ({x.num_axes} axes)"
        )
    return tuple(x.shape[axis:end])


@register
class Bias(Layer):
    type = "Bias"
    min_bottom, max_bottom = 1, 2
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1:
            shape = param_shape(self, bottom[0], p.axis, int(p.num_axes))
            self.blobs = [self.new_blob(shape, self.name + "/bias")]
            fill_blob(self.blobs[0], p.filler)
            self.param_propagate_down = [True]

    def _b(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        b = self._b(bottom)
        self.dims = broadcast_dims(
            self, bottom[0], b.shape, self.param.bias_param.axis, "bottom[1]" if len(bottom) > 1 else "the bias"
        )
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        b = self._b(bottom).dev_data.reshape(1, -1, 1)
        self.xp.add(bottom[0].dev_data.reshape(self.dims), b, out=top[0].dev_data.reshape(self.dims))

    def backward(self, top, propagate_down, bottom):
        dy = top[0].dev_diff.reshape(self.dims)
        if len(bottom) > 1:
            if propagate_down[1]:
                bottom[1].dev_diff.reshape(-1)[...] = dy.sum(axis=(0, 2))
        elif self.param_propagate_down[0]:
            self.blobs[0].dev_diff.reshape(-1)[...] += dy.sum(axis=(0, 2))
        if propagate_down[0] and top[0] is not bottom[0]:
            bottom[0].dev_diff[...] = top[0].dev_diff
