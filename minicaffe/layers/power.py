"""Power: y = (shift + scale * x) ^ power.

Backward: dx = dy * power * scale * (shift + scale * x) ^ (power - 1)  (0 when power is 0 or
scale is 0).  In place keeps a copy of x, which backward needs.
"""

from ..layer import register
from ._common import Neuron, in_place


@register
class Power(Neuron):
    type = "Power"

    def layer_setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self._x = None

    def forward(self, bottom, top):
        x = bottom[0].dev_data
        if in_place(bottom[0], top[0]):
            self._x = x.copy()
            x = self._x
        xp = self.xp
        base = x * self.scale + self.shift
        if self.power == 1.0:
            top[0].dev_data[...] = base
        else:
            xp.power(base, self.power, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx, dy = bottom[0].dev_diff, top[0].dev_diff
        if self.power == 0.0 or self.scale == 0.0:
            dx[...] = 0
            return
        x = self._x if in_place(bottom[0], top[0]) else bottom[0].dev_data
        base = x * self.scale + self.shift
        k = self.power * self.scale
        if self.power == 1.0:
            dx[...] = dy * k
        else:
            dx[...] = dy * (k * self.xp.power(base, self.power - 1.0))
