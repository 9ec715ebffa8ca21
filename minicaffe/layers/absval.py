"""AbsVal: y = |x|;  backward dx = sign(x) * dy.  In place keeps sign(x), which |x| loses."""

from ..layer import register
from ._common import Neuron, in_place


@register
class AbsVal(Neuron):
    type = "AbsVal"

    def layer_setup(self, bottom, top):
        self._sign = None

    def forward(self, bottom, top):
        x = bottom[0].dev_data
        if in_place(bottom[0], top[0]):
            self._sign = self.xp.sign(x)
        self.xp.abs(x, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            sign = self._sign if in_place(bottom[0], top[0]) else self.xp.sign(bottom[0].dev_data)
            self.xp.multiply(top[0].dev_diff, sign, out=bottom[0].dev_diff)
