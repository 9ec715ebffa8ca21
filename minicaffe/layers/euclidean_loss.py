"""EuclideanLoss: loss = sum((a - b)^2) / (2 N), N = bottom[0].shape[0].

Backward to both bottoms (either may be the prediction)::

    da = +loss_weight / N * (a - b)       db = -loss_weight / N * (a - b)
"""

from ..layer import Layer, register
from ._common import shape_str


@register
class EuclideanLoss(Layer):
    type = "EuclideanLoss"
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 1, 1
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer::AutoTopBlobs: a loss with no top gets an anonymous one

    def layer_setup(self, bottom, top):
        self.d = self.new_blob(bottom[0].shape, self.name + "/diff")

    def reshape(self, bottom, top):
        a, b = bottom
        if a.count != b.count or (a.num_axes and b.num_axes and a.shape[0] != b.shape[0]):
            raise self.error(
                f"bottoms differ in shape: {shape_str(a.shape)} vs {shape_str(b.shape)} "
                f"(they need the same number of items and values)"
            )
        self.d.reshape(a.shape)
        top[0].reshape(())

    def forward(self, bottom, top):
        a, b = bottom
        n = a.shape[0] if a.num_axes else 1
        d = self.d.dev_data
        self.xp.subtract(a.dev_data, b.dev_data.reshape(a.shape), out=d)
        top[0].dev_data[...] = float((d * d).sum()) / (2.0 * n)

    def backward(self, top, propagate_down, bottom):
        n = bottom[0].shape[0] if bottom[0].num_axes else 1
        w = float(top[0].dev_diff.reshape(-1)[0]) / n
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                self.xp.multiply(self.d.dev_data, sign * w, out=bottom[i].dev_diff.reshape(self.d.shape))
