"""ELU: y = x where x > 0, alpha * (exp(x) - 1) elsewhere.

Backward: dx = dy where x > 0, dy * (y + alpha) elsewhere.  In place works: y > 0 exactly where
x > 0 (for alpha >= 0), and the rest reads y.
"""

from ..layer import register
from ._common import Neuron


@register
class ELU(Neuron):
    type = "ELU"

    def layer_setup(self, bottom, top):
        self.alpha = float(self.param.elu_param.alpha)

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].dev_data
        neg = self.alpha * xp.expm1(xp.minimum(x, 0))
        xp.add(xp.maximum(x, 0), neg, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x, y, dy = bottom[0].dev_data, top[0].dev_data, top[0].dev_diff
        bottom[0].dev_diff[...] = xp.where(x > 0, dy, dy * (y + self.alpha))
