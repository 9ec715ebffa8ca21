"""Reduction: reduce every axis from ``axis`` on to one number per item, times ``coeff``.

    bottom (d0, ..., d_{axis-1}, ...)  read as (outer, inner)  ->  top (d0, ..., d_{axis-1})
    (axis 0, the default: the whole blob -> a scalar)

Operations and their backward (c = coeff)::

    SUM     y = c sum x          dx = c dy
    ASUM    y = c sum |x|        dx = c sign(x) dy
    SUMSQ   y = c sum x^2        dx = 2 c x dy
    MEAN    y = c sum x / inner  dx = c dy / inner
"""

from ..layer import Layer, register
from ._common import axis_index, count


@register
class Reduction(Layer):
    type = "Reduction"
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.reduction_param
        self.op, self.coeff = p.operation, float(p.coeff)

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (its top has another shape)")
        x = bottom[0]
        axis = axis_index(self, x, self.param.reduction_param.axis) if x.num_axes else 0
        self.outer, self.inner = count(x.shape, 0, axis), count(x.shape, axis)
        top[0].reshape(tuple(x.shape[:axis]))

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].dev_data.reshape(self.outer, self.inner)
        if self.op == "ASUM":
            r = xp.abs(x).sum(axis=1)
        elif self.op == "SUMSQ":
            r = (x * x).sum(axis=1)
        else:
            r = x.sum(axis=1)
        c = self.coeff / self.inner if self.op == "MEAN" else self.coeff
        top[0].dev_data.reshape(self.outer)[...] = r * c

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x = bottom[0].dev_data.reshape(self.outer, self.inner)
        dx = bottom[0].dev_diff.reshape(self.outer, self.inner)
        dy = top[0].dev_diff.reshape(self.outer, 1)
        c = self.coeff / self.inner if self.op == "MEAN" else self.coeff
        if self.op == "ASUM":
            xp.multiply(xp.sign(x), dy * c, out=dx)
        elif self.op == "SUMSQ":
            xp.multiply(x, dy * (2 * c), out=dx)
        else:
            dx[...] = dy * c
