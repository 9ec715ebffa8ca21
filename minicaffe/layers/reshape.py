"""Reshape: give the bottom a new shape without touching its values (Caffe's ReshapeLayer).

``reshape_param.shape`` gives the new dims for the axes ``axis`` .. ``axis + num_axes``
(default: all of them): 0 copies the bottom's dim at that position, -1 (at most once) is
inferred from the count.  E.g. shape { dim: 0 dim: -1 } on (2, 3, 4) gives (2, 12).
The values are copied (Caffe shares memory); not in place.
"""

from ..layer import Layer, register
from ._common import count, shape_str


@register
class Reshape(Layer):
    type = "Reshape"
    backward_reads = "none"  # copies the diff
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        dims = [int(d) for d in self.param.reshape_param.shape.dim]
        if sum(1 for d in dims if d == -1) > 1:
            raise self.error(f"shape {dims} has more than one -1; at most one dim can be inferred")
        if any(d < -1 for d in dims):
            raise self.error(f"shape {dims} has a dim below -1")
        self.dims = dims

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("cannot run in place; give the top its own name")
        x = bottom[0]
        p = self.param.reshape_param
        n = x.num_axes
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} is out of range for bottom[0] of shape {shape_str(x.shape)}")
        if p.num_axes < -1:
            raise self.error(f"num_axes must be -1 (all) or >= 0, got {p.num_axes}")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(f"axis {p.axis} + num_axes {p.num_axes} runs past bottom[0] {shape_str(x.shape)}")
        new = []
        for i, d in enumerate(self.dims):
            if d == 0:
                if start + i >= n:
                    raise self.error(
                        f"shape dim {i} is 0 (copy) but bottom[0] {shape_str(x.shape)} has no axis {start + i}"
                    )
                d = x.shape[start + i]
            new.append(d)
        shape = list(x.shape[:start]) + new + list(x.shape[end:])
        if -1 in new:
            known = count([d for d in shape if d != -1])
            if known == 0 or x.count % known:
                raise self.error(
                    f"cannot infer the -1 dim: bottom[0] {shape_str(x.shape)} has {x.count} "
                    f"values, not a multiple of the other dims' product {known}"
                )
            shape[shape.index(-1)] = x.count // known
        if count(shape) != x.count:
            raise self.error(
                f"the new shape {shape_str(shape)} holds {count(shape)} values but bottom[0] "
                f"{shape_str(x.shape)} holds {x.count}"
            )
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        top[0].dev_flat_data[...] = bottom[0].dev_flat_data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].dev_flat_diff[...] = top[0].dev_flat_diff
