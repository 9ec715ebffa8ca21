"""PReLU: ReLU with a learned negative slope per channel (or one shared by all channels).

Shapes: bottom/top (N, C, ...); slope a (C,), or (1,) with ``channel_shared: true``::

    y  = max(0, x) + a_c * min(0, x)
    dx = dy where x > 0, a_c * dy elsewhere
    da_c += sum over N and the spatial axes of dy * x where x <= 0        (accumulates)

The slope is filled by ``filler`` (default: constant 0.25, as in Caffe).  In place keeps a copy
of x for backward.
"""

from ..layer import register
from ..proto import Message
from ._common import Neuron, fill_blob, has, in_place, shape_str


@register
class PReLU(Neuron):
    type = "PReLU"

    def layer_setup(self, bottom, top):
        p = self.param.prelu_param
        x = bottom[0]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] has shape {shape_str(x.shape)}; PReLU needs at least 2 axes (N, C, ...)")
        self.shared = bool(p.channel_shared)
        self.channels = x.shape[1]
        self.blobs = [self.new_blob((1,) if self.shared else (self.channels,), self.name + "/slope")]
        filler = p.filler if has(p, "filler") else Message("FillerParameter", type="constant", value=0.25)
        fill_blob(self.blobs[0], filler)
        self.param_propagate_down = [True]
        self._x = None

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes < 2 or x.shape[1] != self.channels:
            raise self.error(
                f"bottom[0] has shape {shape_str(x.shape)} but the layer was set up for {self.channels} channels"
            )
        super().reshape(bottom, top)

    def _slope(self, n_axes):
        a = self.blobs[0].dev_data
        return a.reshape((1, -1) + (1,) * (n_axes - 2))

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].dev_data
        if in_place(bottom[0], top[0]):
            self._x = x.copy()
            x = self._x
        a = self._slope(x.ndim)
        xp.add(xp.maximum(x, 0), a * xp.minimum(x, 0), out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        x = self._x if in_place(bottom[0], top[0]) else bottom[0].dev_data
        dy = top[0].dev_diff
        if self.param_propagate_down[0]:
            g = xp.where(x <= 0, dy * x, 0)
            axes = tuple(i for i in range(x.ndim) if i != 1)
            if self.shared:
                self.blobs[0].dev_diff[...] += g.sum()
            else:
                self.blobs[0].dev_diff[...] += g.sum(axis=axes)
        if propagate_down[0]:
            a = self._slope(x.ndim)
            bottom[0].dev_diff[...] = xp.where(x > 0, dy, a * dy)
