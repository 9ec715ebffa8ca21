"""Crop: cut bottom[0] to the shape of bottom[1] from ``axis`` on (FCN's score cropping).

    top shape = bottom[0].shape[:axis] + bottom[1].shape[axis:]
    top = bottom[0][..., o_axis : o_axis + s_axis, ...]       for every axis >= ``axis``

``crop_param.offset``: none (every offset 0), one (the same for every cropped axis) or one per
cropped axis.  Backward: dx = 0 with dy put back in the window; bottom[1] only gives a shape
and gets no gradient.
"""

from ..layer import Layer, register
from ._common import axis_index, shape_str


@register
class Crop(Layer):
    type = "Crop"
    min_bottom, max_bottom = 2, 2
    min_top, max_top = 1, 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        x, ref = bottom
        if x.num_axes != ref.num_axes:
            raise self.error(
                f"bottom[0] {shape_str(x.shape)} and bottom[1] {shape_str(ref.shape)} need the same number of axes"
            )
        p = self.param.crop_param
        axis = axis_index(self, x, p.axis)
        offsets = [int(o) for o in p.offset]
        n = x.num_axes - axis
        if len(offsets) not in (0, 1, n):
            raise self.error(
                f"crop_param gives {len(offsets)} offsets; give none, one, or {n} (one per axis from {axis})"
            )
        if len(offsets) <= 1:
            offsets = (offsets or [0]) * n
        window = [slice(None)] * axis
        shape = list(x.shape[:axis])
        for k, o in enumerate(offsets):
            a = axis + k
            size = ref.shape[a]
            if o + size > x.shape[a]:
                raise self.error(
                    f"axis {a}: offset {o} + size {size} exceeds bottom[0]'s {x.shape[a]} "
                    f"(bottom[0] {shape_str(x.shape)}, bottom[1] {shape_str(ref.shape)})"
                )
            window.append(slice(o, o + size))
            shape.append(size)
        self.window = tuple(window)
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        top[0].dev_data[...] = bottom[0].dev_data[self.window]

    def backward(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to bottom[1] (it only gives the shape)")
        if propagate_down[0]:
            dx = bottom[0].dev_diff
            dx[...] = 0
            dx[self.window] = top[0].dev_diff
