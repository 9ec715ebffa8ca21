"""Clip: y = min(max(x, min), max).

Backward (Caffe's): dx = dy where min <= x <= max, 0 elsewhere.  Forward keeps that mask, so in
place works.
"""

from ..layer import register
from ._common import Neuron


@register
class Clip(Neuron):
    type = "Clip"

    def layer_setup(self, bottom, top):
        p = self.param.clip_param
        if not (p.has("min") and p.has("max")):
            raise self.error("clip_param { min: ... max: ... } is required (both)")
        self.lo, self.hi = float(p.min), float(p.max)
        if self.lo > self.hi:
            raise self.error(f"min {self.lo:g} is greater than max {self.hi:g}")
        self._inside = None

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].dev_data
        self._inside = (x >= self.lo) & (x <= self.hi)
        xp.clip(x, self.lo, self.hi, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.xp.multiply(top[0].dev_diff, self._inside, out=bottom[0].dev_diff)
