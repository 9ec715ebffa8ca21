"""Scale: y = x * s (+ b), s broadcast along some of x's axes (Caffe's ScaleLayer).

s is bottom[1] (two-bottom form) or a learned parameter whose shape is x's shape from ``axis``
over ``num_axes`` axes (-1: to the end; 0: a scalar), filled by ``filler`` (default 1).
``bias_term: true`` adds a learned b of s's shape (filled by ``bias_filler``), the last blob.
x is read as (outer, dim, inner), dim = s.count::

    y[o, d, i] = x[o, d, i] * s[d] + b[d]
    dx = dy * s
    ds[d] (+)= sum over o, i of dy * x      (accumulates into a parameter, overwrites bottom[1])
    db[d] += sum over o, i of dy

In place keeps a copy of x, which ds needs.
"""

from ..layer import Layer, register
from ..proto import Message
from ._common import fill_blob, has, in_place
from .bias import broadcast_dims, param_shape


@register
class Scale(Layer):
    type = "Scale"
    min_bottom, max_bottom = 1, 2
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.blobs = []
        if len(bottom) == 1:
            shape = param_shape(self, bottom[0], p.axis, int(p.num_axes))
            self.blobs.append(self.new_blob(shape, self.name + "/scale"))
            filler = p.filler if has(p, "filler") else Message("FillerParameter", type="constant", value=1.0)
            fill_blob(self.blobs[0], filler)
        self.bias_term = bool(p.bias_term)
        if self.bias_term:
            shape = tuple(bottom[1].shape) if len(bottom) > 1 else self.blobs[0].shape
            self.blobs.append(self.new_blob(shape, self.name + "/bias"))
            fill_blob(self.blobs[-1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)
        self._x = None

    def _s(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        s = self._s(bottom)
        self.dims = broadcast_dims(
            self, bottom[0], s.shape, self.param.scale_param.axis, "bottom[1]" if len(bottom) > 1 else "the scale"
        )
        if self.bias_term and self.blobs[-1].count != s.count:
            raise self.error(f"the bias {self.blobs[-1].shape} does not match the scale {s.shape}")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].dev_data.reshape(self.dims)
        if in_place(bottom[0], top[0]):
            self._x = x.copy()
        y = top[0].dev_data.reshape(self.dims)
        xp.multiply(x, self._s(bottom).dev_data.reshape(1, -1, 1), out=y)
        if self.bias_term:
            y += self.blobs[-1].dev_data.reshape(1, -1, 1)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].dev_diff.reshape(self.dims)
        two = len(bottom) > 1
        if self.bias_term and self.param_propagate_down[-1]:
            self.blobs[-1].dev_diff.reshape(-1)[...] += dy.sum(axis=(0, 2))
        x = self._x if in_place(bottom[0], top[0]) else bottom[0].dev_data.reshape(self.dims)
        if two and propagate_down[1]:
            bottom[1].dev_diff.reshape(-1)[...] = (dy * x).sum(axis=(0, 2))
        elif not two and self.param_propagate_down[0]:
            self.blobs[0].dev_diff.reshape(-1)[...] += (dy * x).sum(axis=(0, 2))
        if propagate_down[0]:
            s = self._s(bottom).dev_data.reshape(1, -1, 1)
            self.xp.multiply(dy, s, out=bottom[0].dev_diff.reshape(self.dims))
