"""ContrastiveLoss (Hadsell, Chopra, LeCun 2006; Caffe's siamese example).

Bottoms: a (N, C, 1, 1) and b (the same shape; any shape with N items works), y (N, ...) with N
values, 1 for a similar pair and 0 for a dissimilar one (read as an integer, as Caffe casts it).
With d_i = ||a_i - b_i|| and m = ``contrastive_loss_param.margin`` (1.0)::

    loss = 1/(2N) sum_i  y_i d_i^2 + (1 - y_i) max(m - d_i, 0)^2
           (legacy_version: (1 - y_i) max(m - d_i^2, 0), Caffe's first form)

Backward, alpha = +-loss_weight / N (+ for a, - for b)::

    similar:      da_i = alpha (a_i - b_i)
    dissimilar:   da_i = -alpha (m - d_i) / (d_i + 1e-4) (a_i - b_i)   where m - d_i > 0, else 0
    legacy:       da_i = -alpha (a_i - b_i)                            where m - d_i^2 > 0, else 0

The 1e-4 in the dissimilar term is Caffe's (it keeps a zero distance finite); minicaffe keeps it
so a net trains as in Caffe, at the price of a gradient 1e-4 / d_i off the exact one.  There is
no gradient to y.
"""

from ..layer import Layer, register
from ._common import shape_str

EPSILON = 1e-4


@register
class ContrastiveLoss(Layer):
    type = "ContrastiveLoss"
    min_bottom, max_bottom = 3, 3
    min_top, max_top = 1, 1
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer::AutoTopBlobs: a loss with no top gets an anonymous one

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def layer_setup(self, bottom, top):
        p = self.param.contrastive_loss_param
        self.margin = float(p.margin)
        self.legacy = bool(p.legacy_version)

    def reshape(self, bottom, top):
        a, b, y = bottom
        if a.shape != b.shape:
            raise self.error(
                f"bottom[0] {shape_str(a.shape)} and bottom[1] {shape_str(b.shape)} must have the same shape"
            )
        n = a.shape[0] if a.num_axes else 1
        if y.count != n:
            raise self.error(
                f"bottom[2] (similarity labels) of shape {shape_str(y.shape)} has {y.count} values "
                f"but bottom[0] of shape {shape_str(a.shape)} has {n} items"
            )
        self.n = n
        top[0].reshape(())

    def _terms(self, bottom):
        xp = self.xp
        a, b, y = bottom
        diff = (a.dev_data - b.dev_data).reshape(self.n, -1)
        dist_sq = (diff * diff).sum(axis=1)
        similar = y.dev_data.reshape(-1).astype(xp.int64) != 0
        return diff, dist_sq, similar

    def forward(self, bottom, top):
        xp = self.xp
        _, dist_sq, similar = self._terms(bottom)
        if self.legacy:
            dissimilar = xp.maximum(self.margin - dist_sq, 0)
        else:
            dissimilar = xp.maximum(self.margin - xp.sqrt(dist_sq), 0) ** 2
        loss = xp.where(similar, dist_sq, dissimilar).sum()
        top[0].dev_data[...] = float(loss) / (2.0 * self.n)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the similarity labels (bottom[2])")
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp = self.xp
        diff, dist_sq, similar = self._terms(bottom)
        if self.legacy:
            coef = xp.where(self.margin - dist_sq > 0, -1.0, 0.0)
        else:
            dist = xp.sqrt(dist_sq)
            mdist = self.margin - dist
            coef = xp.where(mdist > 0, -mdist / (dist + EPSILON), 0.0)
        coef = xp.where(similar, 1.0, coef).astype(self.dtype)
        w = float(top[0].dev_diff.reshape(-1)[0]) / self.n
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                dx = bottom[i].dev_diff.reshape(self.n, -1)
                xp.multiply(diff, (sign * w) * coef[:, None], out=dx)
