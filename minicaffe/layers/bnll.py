"""BNLL (binomial normal log likelihood): y = log(1 + exp(x)), the softplus, computed without
overflow as max(x, 0) + log1p(exp(-|x|)).

Backward: dx = dy * sigmoid(x) = dy * (1 - exp(-y)) = -dy * expm1(-y), read from y so in place
works.
"""

from ..layer import register
from ._common import Neuron


@register
class BNLL(Neuron):
    type = "BNLL"

    def forward(self, bottom, top):
        self.xp.logaddexp(0, bottom[0].dev_data, out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            xp = self.xp
            sig = xp.expm1(-top[0].dev_data)  # -sigmoid(x); dx may be dy (in place)
            xp.negative(sig, out=sig)
            xp.multiply(top[0].dev_diff, sig, out=bottom[0].dev_diff)
