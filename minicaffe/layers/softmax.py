"""Softmax over one axis (``softmax_param.axis``, default 1).

The bottom is read as (outer, C, inner) with C the softmax axis::

    y[o, :, i] = exp(x[o, :, i] - max) / sum(exp(x[o, :, i] - max))
    dx = (dy - sum_c(dy * y)) * y
"""

from ..layer import register
from ._common import Neuron, axis_index, count, in_place


@register
class Softmax(Neuron):
    type = "Softmax"

    def reshape(self, bottom, top):
        x = bottom[0]
        self.axis = axis_index(self, x, self.param.softmax_param.axis)
        self.dims = (count(x.shape, 0, self.axis), x.shape[self.axis], count(x.shape, self.axis + 1))
        super().reshape(bottom, top)

    def forward(self, bottom, top):
        self.backend.softmax_fwd(bottom[0].dev_data.reshape(self.dims), top[0].dev_data.reshape(self.dims))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].dev_diff.reshape(self.dims)
        if in_place(bottom[0], top[0]):
            dy = dy.copy()
        self.backend.softmax_bwd(top[0].dev_data.reshape(self.dims), dy, bottom[0].dev_diff.reshape(self.dims))
