"""Concat: join the bottoms along ``axis`` (default 1; the legacy ``concat_dim`` also works).

Every bottom has the top's shape except along the axis; top's size there is the sum.
Backward hands each bottom its slice of dy.
"""

from ..layer import Layer, register
from ._common import axis_index, has, shape_str


@register
class Concat(Layer):
    type = "Concat"
    backward_reads = "none"  # slices the top diff
    min_bottom, max_bottom = 1, None
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        if has(p, "axis") and has(p, "concat_dim"):
            raise self.error("give axis or concat_dim, not both")
        self.axis_param = int(p.concat_dim) if has(p, "concat_dim") else int(p.axis)

    def reshape(self, bottom, top):
        first = bottom[0]
        self.axis = axis_index(self, first, self.axis_param)
        total = 0
        for i, b in enumerate(bottom):
            if b.num_axes != first.num_axes:
                raise self.error(
                    f"bottoms differ in number of axes: bottom[0] {shape_str(first.shape)} "
                    f"vs bottom[{i}] {shape_str(b.shape)}"
                )
            for ax in range(first.num_axes):
                if ax != self.axis and b.shape[ax] != first.shape[ax]:
                    raise self.error(
                        f"bottoms differ in shape: {shape_str(first.shape)} vs "
                        f"{shape_str(b.shape)} along axis {ax} (concatenating along "
                        f"axis {self.axis})"
                    )
            total += b.shape[self.axis]
        shape = list(first.shape)
        shape[self.axis] = total
        top[0].reshape(tuple(shape))

    def _slices(self, bottom):
        start = 0
        lead = (slice(None),) * self.axis
        for b in bottom:
            n = b.shape[self.axis]
            yield b, lead + (slice(start, start + n),)
            start += n

    def forward(self, bottom, top):
        y = top[0].dev_data
        for b, sl in self._slices(bottom):
            y[sl] = b.dev_data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].dev_diff
        for i, (b, sl) in enumerate(self._slices(bottom)):
            if propagate_down[i]:
                b.dev_diff[...] = dy[sl]
