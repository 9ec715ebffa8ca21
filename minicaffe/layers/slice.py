"""Slice: split the bottom along ``axis`` (legacy ``slice_dim``) into the tops.

``slice_point``s (increasing, one fewer than the tops) say where to cut; without them the axis
is cut into len(top) equal parts.  Backward writes each top's diff back into its slice.
"""

from ..layer import Layer, register
from ._common import axis_index, has, shape_str


@register
class Slice(Layer):
    type = "Slice"
    backward_reads = "none"  # concatenates the top diffs
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, None

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        if has(p, "axis") and has(p, "slice_dim"):
            raise self.error("give axis or slice_dim, not both")
        self.axis_param = int(p.slice_dim) if has(p, "slice_dim") else int(p.axis)
        self.points = [int(v) for v in p.slice_point]
        if self.points and len(self.points) != len(top) - 1:
            raise self.error(f"{len(self.points)} slice_point(s) need {len(self.points) + 1} tops, got {len(top)}")

    def reshape(self, bottom, top):
        x = bottom[0]
        self.axis = axis_index(self, x, self.axis_param)
        size = x.shape[self.axis]
        if self.points:
            bounds = [0] + self.points + [size]
            if any(b >= e for b, e in zip(bounds, bounds[1:])):
                raise self.error(
                    f"slice_point {self.points} must increase strictly inside (0, {size}) "
                    f"for bottom[0] {shape_str(x.shape)} along axis {self.axis}"
                )
        else:
            if size % len(top):
                raise self.error(
                    f"bottom[0] {shape_str(x.shape)} has {size} along axis {self.axis}, "
                    f"which does not split evenly into {len(top)} tops"
                )
            step = size // len(top)
            bounds = list(range(0, size + 1, step))
        self.bounds = bounds
        for t, (b, e) in zip(top, zip(bounds, bounds[1:])):
            shape = list(x.shape)
            shape[self.axis] = e - b
            t.reshape(tuple(shape))

    def _slices(self, top):
        lead = (slice(None),) * self.axis
        for t, (b, e) in zip(top, zip(self.bounds, self.bounds[1:])):
            yield t, lead + (slice(b, e),)

    def forward(self, bottom, top):
        x = bottom[0].dev_data
        for t, sl in self._slices(top):
            t.dev_data[...] = x[sl]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].dev_diff
        for t, sl in self._slices(top):
            dx[sl] = t.dev_diff
