"""Log: y = log_base(shift + scale * x)  (base -1, the default, means e).

Backward: dx = dy * scale / ((shift + scale * x) * ln(base)).  In place keeps a copy of
shift + scale * x, which y loses.
"""

import math

from ..layer import register
from ._common import Neuron


@register
class Log(Neuron):
    type = "Log"

    def layer_setup(self, bottom, top):
        p = self.param.log_param
        base = float(p.base)
        if base != -1.0 and (base <= 0 or base == 1.0):
            raise self.error(f"base must be positive and not 1 (or -1 for e), got {base:g}")
        self.base_scale = 1.0 if base == -1.0 else 1.0 / math.log(base)
        self.scale, self.shift = float(p.scale), float(p.shift)
        self._u = None

    def forward(self, bottom, top):
        xp = self.xp
        u = bottom[0].dev_data * self.scale  # a fresh array: shift + scale * x, kept for backward
        if self.shift:
            u += self.shift
        self._u = u
        xp.log(u, out=top[0].dev_data)
        if self.base_scale != 1.0:
            top[0].dev_data[...] *= self.base_scale

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dx = bottom[0].dev_diff
            self.xp.divide(top[0].dev_diff, self._u, out=dx)
            dx *= self.scale * self.base_scale
