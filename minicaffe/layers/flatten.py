"""Flatten: merge the axes ``axis`` .. ``end_axis`` (default 1 .. -1) into one.

(N, C, H, W) -> (N, C*H*W) with the defaults.  The values are copied (Caffe shares memory);
backward copies dy back.  Not in place: the top has another shape.
"""

from ..layer import Layer, register
from ._common import axis_index, count


@register
class Flatten(Layer):
    type = "Flatten"
    backward_reads = "none"  # copies the diff
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (its top has another shape); give the top its own name")
        x = bottom[0]
        p = self.param.flatten_param
        start = axis_index(self, x, p.axis, "axis")
        end = axis_index(self, x, p.end_axis, "end_axis")
        if end < start:
            raise self.error(f"end_axis {p.end_axis} comes before axis {p.axis} in bottom[0] of shape {x.shape}")
        shape = tuple(x.shape[:start]) + (count(x.shape, start, end + 1),) + tuple(x.shape[end + 1 :])
        top[0].reshape(shape)

    def forward(self, bottom, top):
        top[0].dev_flat_data[...] = bottom[0].dev_flat_data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].dev_flat_diff[...] = top[0].dev_flat_diff
