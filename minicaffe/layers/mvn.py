"""MVN: mean-variance normalization of each item (each channel of each item, or the whole item
with ``across_channels``).

    x read as (groups, D): groups = N*C and D = H*W, or groups = N and D = C*H*W (across_channels)
    y = x - mean(x)                                         (normalize_variance: false)
    y = (x - mean(x)) / (std(x) + eps)                      (the default; std = sqrt of the
                                                             population variance, as Caffe)
Backward (Caffe's, exact at eps = 0; eps defaults to 1e-9)::

    dx = dy - mean(dy)                                      (no variance)
    dx = (dy - mean(dy) - y * mean(dy * y)) / (std + eps)
"""

from ..layer import Layer, register
from ._common import count


@register
class MVN(Layer):
    type = "MVN"
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = bool(p.normalize_variance)
        self.across_channels = bool(p.across_channels)
        self.eps = float(p.eps)
        self._std = None

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] needs at least 2 axes (N, C, ...), got shape {x.shape}")
        if top[0] is not x:
            top[0].reshape(x.shape)
        self.groups = x.shape[0] if self.across_channels else count(x.shape, 0, 2)
        self.d = x.count // max(1, self.groups)

    def forward(self, bottom, top):
        x = bottom[0].dev_data.reshape(self.groups, self.d)
        y = top[0].dev_data.reshape(self.groups, self.d)
        self.xp.subtract(x, x.mean(axis=1, keepdims=True), out=y)
        if self.normalize_variance:
            std = self.xp.sqrt((y * y).mean(axis=1, keepdims=True))
            std += self.eps
            self._std = std
            y /= std

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].dev_diff.reshape(self.groups, self.d)
        dx = bottom[0].dev_diff.reshape(self.groups, self.d)
        if self.normalize_variance:
            y = top[0].dev_data.reshape(self.groups, self.d)
            g = dy - dy.mean(axis=1, keepdims=True) - y * (dy * y).mean(axis=1, keepdims=True)
            self.xp.divide(g, self._std, out=dx)
        else:
            self.xp.subtract(dy, dy.mean(axis=1, keepdims=True), out=dx)
