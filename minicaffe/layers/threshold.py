"""Threshold: y = 1 where x > threshold, else 0.

Caffe gives it no backward (it aborts); the derivative is 0 wherever it exists, so minicaffe
writes dx = 0.
"""

from ..layer import register
from ._common import Neuron


@register
class Threshold(Neuron):
    type = "Threshold"

    def layer_setup(self, bottom, top):
        self.threshold = float(self.param.threshold_param.threshold)

    def forward(self, bottom, top):
        top[0].dev_data[...] = bottom[0].dev_data > self.threshold

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].dev_diff[...] = 0
