"""Swish: y = x * sigmoid(beta * x)  (beta = swish_param.beta, 1 by default).

Backward (Caffe's form, from y and s = sigmoid(beta x)): dx = dy * (beta y + s (1 - beta y)).
Forward keeps s, so in place works.
"""

from ..layer import register
from ._common import Neuron


@register
class Swish(Neuron):
    type = "Swish"

    def layer_setup(self, bottom, top):
        self.beta = float(self.param.swish_param.beta)
        self._s = None

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].dev_data
        s = x * self.beta
        self.backend.sigmoid_fwd(s.reshape(-1), s.reshape(-1))
        self._s = s
        xp.multiply(x, s, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            by = top[0].dev_data * self.beta
            g = self._s * (1.0 - by)
            g += by  # dx may be dy (in place): multiply last
            self.xp.multiply(top[0].dev_diff, g, out=bottom[0].dev_diff)
