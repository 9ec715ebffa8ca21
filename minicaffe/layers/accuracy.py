"""Accuracy: the fraction of items whose true class is among the top_k scores.

Shapes: bottom[0] scores (outer, C, inner) around ``axis`` (default 1); bottom[1] labels with
outer * inner values; top[0] the accuracy (scalar); optional top[1] the accuracy per class (C,).

As in Caffe, an item is correct when fewer than top_k *other* classes score >= the true class
(so ties count against it); positions whose label is ``ignore_label`` are skipped; with no
counted item the accuracy is 0, and a class with no item has per-class accuracy 0.
Accuracy has no backward.
"""

from ..layer import Layer, register
from ._common import axis_index, count, has, shape_str


@register
class Accuracy(Layer):
    type = "Accuracy"
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 1, 2

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = int(p.top_k)
        if self.top_k < 1:
            raise self.error(f"top_k must be at least 1, got {self.top_k}")
        self.has_ignore = has(p, "ignore_label")
        self.ignore_label = int(p.ignore_label) if self.has_ignore else None

    def reshape(self, bottom, top):
        x, label = bottom
        self.axis = axis_index(self, x, self.param.accuracy_param.axis)
        self.outer = count(x.shape, 0, self.axis)
        self.inner = count(x.shape, self.axis + 1)
        self.classes = x.shape[self.axis]
        if self.top_k > self.classes:
            raise self.error(
                f"top_k {self.top_k} is more than the {self.classes} classes of bottom[0] "
                f"{shape_str(x.shape)} along axis {self.axis}"
            )
        if label.count != self.outer * self.inner:
            raise self.error(
                f"bottom[1] (labels) of shape {shape_str(label.shape)} has {label.count} values but "
                f"bottom[0] of shape {shape_str(x.shape)} needs {self.outer * self.inner} (one per item "
                f"outside the class axis {self.axis})"
            )
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.classes,))

    def forward(self, bottom, top):
        xp = self.xp
        scores = bottom[0].dev_data.reshape(self.outer, self.classes, self.inner)
        lab = xp.trunc(bottom[1].dev_data.reshape(self.outer, self.inner))
        keep = xp.ones(lab.shape, dtype=bool) if not self.has_ignore else (lab != self.ignore_label)
        bad = keep & ((lab < 0) | (lab >= self.classes))
        if bool(bad.any()):
            raise self.error(
                f"bottom[1] holds label {float(lab[bad].ravel()[0]):g}, outside [0, "
                f"{self.classes}) for {self.classes} classes"
            )
        li = xp.where(keep, lab, 0).astype(xp.int64)
        true = xp.take_along_axis(scores, li[:, None, :], axis=1)  # (outer, 1, inner)
        better = (scores >= true).sum(axis=1) - 1  # other classes >= true
        correct = (better < self.top_k) & keep
        n = int(keep.sum())
        top[0].dev_data[...] = float(correct.sum()) / n if n else 0.0
        if len(top) > 1:
            per_class = xp.bincount(li[keep], minlength=self.classes)
            hits = xp.bincount(li[correct], minlength=self.classes)
            top[1].dev_data[...] = xp.where(per_class > 0, hits / xp.maximum(per_class, 1), 0)
