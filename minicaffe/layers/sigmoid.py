"""Sigmoid: y = 1 / (1 + exp(-x));  backward dx = dy * y * (1 - y) (reads the top, so in place works)."""

from ..layer import register
from ._common import Neuron


@register
class Sigmoid(Neuron):
    type = "Sigmoid"

    def forward(self, bottom, top):
        self.backend.sigmoid_fwd(bottom[0].dev_flat_data, top[0].dev_flat_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.sigmoid_bwd(top[0].dev_flat_data, top[0].dev_flat_diff, bottom[0].dev_flat_diff)
