"""LRN: local response normalization (AlexNet's), Caffe's two regions.

Shapes: bottom/top (N, C, H, W); n = local_size (odd), window offsets -(n-1)/2 .. (n-1)/2.

ACROSS_CHANNELS::

    scale[c] = k + alpha / n * sum_{c' in window(c)} x[c']^2        (zero outside 0..C-1)
    y = x * scale^-beta
    dx = dy * scale^-beta - (2 alpha beta / n) * x * sum_{c' in window(c)} (dy y / scale)[c']

WITHIN_CHANNEL (Caffe builds it from Power, Pooling AVE and Eltwise; note its shift is 1: ``k``
is not used there, as in Caffe)::

    scale = 1 + alpha / n^2 * sum_{n x n spatial window, zero padded} x^2
    y = x * scale^-beta
    dx = dy * scale^-beta - (2 alpha beta / n^2) * x * boxsum(dy y / scale)

The window is symmetric, so the backward sum runs over the same window.
"""

from ..layer import register
from ._common import Neuron, in_place, shape_str


@register
class LRN(Neuron):
    type = "LRN"

    def layer_setup(self, bottom, top):
        p = self.param.lrn_param
        self.size = int(p.local_size)
        if self.size <= 0 or self.size % 2 == 0:
            raise self.error(f"local_size must be odd and positive, got {self.size}")
        self.alpha, self.beta, self.k = float(p.alpha), float(p.beta), float(p.k)
        self.region = p.norm_region
        self._x = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"bottom[0] has shape {shape_str(bottom[0].shape)}; expected 4 axes (N, C, H, W)")
        super().reshape(bottom, top)

    def _window_sum(self, a):
        """Sum of ``a`` over the window around each position (channels, or an n x n square)."""
        xp, r = self.xp, (self.size - 1) // 2
        if self.region == "ACROSS_CHANNELS":
            axes = (1,)
        else:
            axes = (2, 3)
        for ax in axes:
            pad = [(0, 0)] * 4
            pad[ax] = (r, r)
            padded = xp.pad(a, pad)
            length = a.shape[ax]
            out = xp.zeros_like(a)
            for off in range(self.size):
                sl = [slice(None)] * 4
                sl[ax] = slice(off, off + length)
                out += padded[tuple(sl)]
            a = out
        return a

    def _scale(self, x):
        if self.region == "ACROSS_CHANNELS":
            return self.k + (self.alpha / self.size) * self._window_sum(x * x)
        return 1.0 + (self.alpha / (self.size * self.size)) * self._window_sum(x * x)

    def forward(self, bottom, top):
        x = bottom[0].dev_data
        self.scale = self._scale(x)
        if in_place(bottom[0], top[0]):
            self._x = x.copy()
        self.xp.multiply(x, self.xp.power(self.scale, -self.beta), out=top[0].dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x = self._x if in_place(bottom[0], top[0]) else bottom[0].dev_data
        y, dy = top[0].dev_data, top[0].dev_diff
        n = self.size if self.region == "ACROSS_CHANNELS" else self.size * self.size
        ratio = self._window_sum(dy * y / self.scale)
        bottom[0].dev_diff[...] = dy * xp.power(self.scale, -self.beta) - (2.0 * self.alpha * self.beta / n) * x * ratio
