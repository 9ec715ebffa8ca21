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

Where the numbers live: forward is ONE fused call, ``backend.softmax_xent_fwd`` (softmax, the
loss, its normalization and the label check, written to top[0] and to a 4-number status on the
device; one launch on a GPU), and backward reads its scale (loss weight / normalizer) on the
device too.  A label outside [0, C) is found on the device; the layer then reads the status (one
small copy) and raises naming the label -- at once by default, or, with ``deferred_checks`` set
(a step that must not wait for the host, e.g. one captured as a CUDA graph), when the net's
``check_deferred()`` asks, the loss being NaN meanwhile.
"""

import numpy as np

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
        # [loss sum, count, first bad label position or inf, normalizer], on the device
        self.status = self.xp.zeros(4, dtype=np.float64)
        self._label_blob = None
        self._shaped = None  # (scores shape, labels shape) of the last reshape: nothing to redo

    def reshape(self, bottom, top):
        x, label = bottom
        if self._shaped == (x.shape, label.shape):
            return  # as the last call left it (the net reshapes before every forward)
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
        self._shaped = (x.shape, label.shape)

    def _labels(self, label_blob):
        return label_blob.dev_data.reshape(self.outer, self.inner)

    def forward(self, bottom, top):
        # VALID divides by the count of labelled positions, known on the device: 0 says so
        normalizer = (
            0.0 if self.normalization == "VALID" else loss_normalizer(self.normalization, self.outer, self.inner, -1)
        )
        self._label_blob = bottom[1]
        self.backend.softmax_xent_fwd(
            bottom[0].dev_data.reshape(self.dims),
            self._labels(bottom[1]),
            self.ignore_label,
            self.has_ignore,
            normalizer,
            self.prob.dev_data.reshape(self.dims),
            self.status,
            top[0].dev_flat_data,
        )
        if not self.deferred_checks:
            self.check_deferred()
        if len(top) > 1:
            top[1].dev_data[...] = self.prob.dev_data

    def check_deferred(self):
        """Raise for a label outside [0, C) that the last forward found (reads the 4-number
        status: one small device->host copy on a GPU; the label's value only when there is one)."""
        if self._label_blob is None:
            return
        bad = self.backend.to_host(self.status)[2]
        if bad == np.inf:
            return
        o, k = divmod(int(bad), self.inner)
        value = float(self._label_blob.cpu_data().reshape(self.outer, self.inner)[o, k])
        c = self.dims[1]
        raise self.error(
            f"bottom[1] holds label {value:g}, outside [0, {c}) for {c} classes"
            + (f" and not the ignore_label {self.ignore_label}" if self.has_ignore else "")
            + (f" (item {o}" + (f", position {k})" if self.inner > 1 else ")"))
        )

    def backward(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to the labels (bottom[1])")
        if not propagate_down[0]:
            return
        self.backend.softmax_loss_bwd(
            self.prob.dev_data.reshape(self.dims),
            self._labels(bottom[1]),
            self.ignore_label,
            self.has_ignore,
            (top[0].dev_flat_diff, self.status),  # the scale, loss weight / normalizer, read on the device
            bottom[0].dev_diff.reshape(self.dims),
        )
