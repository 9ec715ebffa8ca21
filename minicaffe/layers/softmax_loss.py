"""SoftmaxWithLoss: softmax over ``softmax_param.axis`` then the multinomial logistic loss.

Shapes: bottom[0] scores (outer, C, inner) around the softmax axis; bottom[1] labels with
outer * inner values (e.g. (N,) or (N, 1, H, W)), integers in [0, C); top[0] the loss, a
scalar; optional top[1] the probabilities (bottom[0]'s shape)::

    loss = -sum over non-ignored (o, i) of log(max(prob[o, label, i], FLT_MIN)) / normalizer
    dx   = loss_weight / normalizer * (prob - onehot(label)),  0 at ignored positions

``loss_param``: ``ignore_label`` (those positions count for nothing), ``normalization``
FULL (outer*inner) | VALID (non-ignored count, the default) | BATCH_SIZE (outer) | NONE (1),
and the legacy ``normalize: false`` = BATCH_SIZE.  The loss weight is read from top[0].dev_diff.
There is no gradient to the labels.
"""

from ..layer import Layer, register
from ._common import axis_index, count, has, loss_normalization, loss_normalizer, shape_str


@register
class SoftmaxWithLoss(Layer):
    type = "SoftmaxWithLoss"
    backward_reads = "bottom"  # the labels (bottom 1); the probabilities are kept inside
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 1, 2
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer::AutoTopBlobs: a loss with no top gets an anonymous one

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.has_ignore = has(lp, "ignore_label")
        self.ignore_label = int(lp.ignore_label) if self.has_ignore else -1
        self.normalization = loss_normalization(self, "VALID")
        self.prob = self.new_blob(bottom[0].shape, self.name + "/prob")
        self.normalizer = 1.0

    def reshape(self, bottom, top):
        x, label = bottom
        self.axis = axis_index(self, x, self.param.softmax_param.axis)
        self.outer = count(x.shape, 0, self.axis)
        self.inner = count(x.shape, self.axis + 1)
        self.dims = (self.outer, x.shape[self.axis], self.inner)
        if label.count != self.outer * self.inner:
            raise self.error(
                f"bottom[1] (labels) of shape {shape_str(label.shape)} has {label.count} values but "
                f"bottom[0] of shape {shape_str(x.shape)} needs {self.outer * self.inner} (one per item "
                f"outside the softmax axis {self.axis})"
            )
        self.prob.reshape(x.shape)
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape(x.shape)

    def _labels(self, label_blob):
        xp = self.xp
        lab = label_blob.dev_data.reshape(self.outer, self.inner)
        c = self.dims[1]
        valid = (lab >= 0) & (lab < c)
        if self.has_ignore:
            valid |= lab == self.ignore_label
        if not bool(valid.all()):
            bad = lab[~valid]
            raise self.error(
                f"bottom[1] holds label {float(bad.ravel()[0]):g}, outside [0, {c}) "
                f"for {c} classes" + (f" and not the ignore_label {self.ignore_label}" if self.has_ignore else "")
            )
        if lab.dtype != self.dtype:
            lab = xp.asarray(lab, dtype=self.dtype)
        return lab

    def forward(self, bottom, top):
        be = self.backend
        prob = self.prob.dev_data.reshape(self.dims)
        be.softmax_fwd(bottom[0].dev_data.reshape(self.dims), prob)
        lab = self._labels(bottom[1])
        loss_sum, valid = be.softmax_loss_fwd(prob, lab, self.ignore_label, self.has_ignore)
        self.normalizer = loss_normalizer(self.normalization, self.outer, self.inner, int(valid))
        top[0].dev_data[...] = float(loss_sum) / self.normalizer
        if len(top) > 1:
            top[1].dev_data[...] = self.prob.dev_data

    def backward(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to the labels (bottom[1])")
        if not propagate_down[0]:
            return
        scale = float(top[0].dev_diff.reshape(-1)[0]) / self.normalizer
        lab = self._labels(bottom[1])
        self.backend.softmax_loss_bwd(
            self.prob.dev_data.reshape(self.dims),
            lab,
            self.ignore_label,
            self.has_ignore,
            scale,
            bottom[0].dev_diff.reshape(self.dims),
        )
