"""TanH: y = tanh(x);  backward dx = dy * (1 - y^2) (reads the top, so in place works)."""

from ..layer import register
from ._common import Neuron


@register
class TanH(Neuron):
    type = "TanH"

    def forward(self, bottom, top):
        self.backend.tanh_fwd(bottom[0].dev_flat_data, top[0].dev_flat_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.tanh_bwd(top[0].dev_flat_data, top[0].dev_flat_diff, bottom[0].dev_flat_diff)
