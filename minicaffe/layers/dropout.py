"""Dropout: at TRAIN, drop each value with probability p = dropout_ratio and scale the kept ones
by 1 / (1 - p) (inverted dropout, as Caffe); at TEST, the identity.

    TRAIN:  mask ~ Bernoulli(1 - p);  y = x * mask / (1 - p);  dx = dy * mask / (1 - p)
    TEST:   y = x;                    dx = dy

The mask is drawn from minicaffe.rng on the host (then moved to the device), so
``set_random_seed`` reproduces it.  In place works: backward reads only the mask.
"""

from ..layer import register
from ..rng import get_rng
from ._common import Neuron


@register
class Dropout(Neuron):
    type = "Dropout"
    backward_reads = "none"  # keeps its mask

    def layer_setup(self, bottom, top):
        self.ratio = float(self.param.dropout_param.dropout_ratio)
        if not 0.0 <= self.ratio < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {self.ratio}")
        self.scale = 1.0 / (1.0 - self.ratio)
        self._mask = None

    def forward(self, bottom, top):
        x, y = bottom[0].dev_data, top[0].dev_data
        if self.phase != "TRAIN":
            if y is not x:
                y[...] = x
            return
        keep = get_rng().random(x.shape) >= self.ratio
        # the mask carries the scale: one multiply forward, one backward
        mask = self.backend.from_host(keep.astype(self.dtype) * self.dtype.type(self.scale), self.dtype)
        self._mask = mask
        self.xp.multiply(x, mask, out=y)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy, dx = top[0].dev_diff, bottom[0].dev_diff
        if self.phase != "TRAIN":
            if dx is not dy:
                dx[...] = dy
            return
        self.xp.multiply(dy, self._mask, out=dx)
