"""SigmoidCrossEntropyLoss: the cross-entropy of sigmoid(x) against targets t in [0, 1].

Shapes: bottom[0] scores x and bottom[1] targets t, the same count; top[0] the loss (scalar)::

    loss = -sum over non-ignored i of [ x_i (t_i - [x_i >= 0]) - log(1 + exp(x_i - 2 x_i [x_i >= 0])) ]
           / normalizer                    (the numerically stable form Caffe uses)
    dx   = loss_weight / normalizer * (sigmoid(x) - t),  0 where t == ignore_label

``normalization`` as SoftmaxWithLoss with outer = N (bottom[0].shape[0]) and inner = the rest;
the default here is BATCH_SIZE, as in Caffe.  No gradient to the targets.
"""

from ..layer import Layer, register
from ._common import count, has, loss_normalization, loss_normalizer, shape_str


@register
class SigmoidCrossEntropyLoss(Layer):
    type = "SigmoidCrossEntropyLoss"
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 1, 1
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer::AutoTopBlobs: a loss with no top gets an anonymous one

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.has_ignore = has(lp, "ignore_label")
        self.ignore_label = int(lp.ignore_label) if self.has_ignore else 0
        self.normalization = loss_normalization(self, "BATCH_SIZE")
        self.normalizer = 1.0
        self.sig = self.new_blob(bottom[0].shape, self.name + "/sigmoid")

    def reshape(self, bottom, top):
        x, t = bottom
        if x.count != t.count:
            raise self.error(
                f"bottom[0] {shape_str(x.shape)} and bottom[1] {shape_str(t.shape)} "
                f"must have the same count ({x.count} vs {t.count})"
            )
        self.outer = x.shape[0] if x.num_axes else 1
        self.inner = count(x.shape, 1)
        self.sig.reshape(x.shape)
        top[0].reshape(())

    def _ignored(self, t):
        # Caffe compares static_cast<int>(target) with the ignore label
        return self.xp.trunc(t) == self.ignore_label

    def forward(self, bottom, top):
        xp = self.xp
        x, t = bottom[0].dev_data, bottom[1].dev_data.reshape(bottom[0].shape)
        self.backend.sigmoid_fwd(bottom[0].dev_flat_data, self.sig.dev_flat_data)
        pos = (x >= 0).astype(x.dtype)
        terms = x * (t - pos) - xp.log1p(xp.exp(x - 2 * x * pos))
        if self.has_ignore:
            keep = ~self._ignored(t)
            loss = -float(xp.where(keep, terms, 0).sum())
            valid = int(keep.sum())
        else:
            loss = -float(terms.sum())
            valid = x.size
        self.normalizer = loss_normalizer(self.normalization, self.outer, self.inner, valid)
        top[0].dev_data[...] = loss / self.normalizer

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to the targets (bottom[1])")
        if not propagate_down[0]:
            return
        t = bottom[1].dev_data.reshape(bottom[0].shape)
        dx = bottom[0].dev_diff
        self.xp.subtract(self.sig.dev_data, t, out=dx)
        if self.has_ignore:
            dx[self._ignored(t)] = 0
        dx *= float(top[0].dev_diff.reshape(-1)[0]) / self.normalizer
