"""Exp: y = base ^ (shift + scale * x)  (base -1, the default, means e).

Backward: dx = dy * y * ln(base) * scale.  It reads only y, so in place works.
"""

import math

from ..layer import register
from ._common import Neuron


@register
class Exp(Neuron):
    type = "Exp"

    def layer_setup(self, bottom, top):
        p = self.param.exp_param
        base = float(p.base)
        if base != -1.0 and base <= 0:
            raise self.error(f"base must be positive (or -1 for e), got {base:g}")
        log_base = 1.0 if base == -1.0 else math.log(base)
        self.inner_scale = log_base * float(p.scale)  # y = exp(inner_scale * x + inner_shift)
        self.inner_shift = log_base * float(p.shift)

    def forward(self, bottom, top):
        y = top[0].dev_data
        self.xp.multiply(bottom[0].dev_data, self.inner_scale, out=y)
        if self.inner_shift:
            y += self.inner_shift
        self.xp.exp(y, out=y)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dx = bottom[0].dev_diff
            self.xp.multiply(top[0].dev_diff, top[0].dev_data, out=dx)
            if self.inner_scale != 1.0:
                dx *= self.inner_scale
