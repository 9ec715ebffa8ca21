"""ArgMax: the indices (and optionally the values) of the top_k largest entries.

Without ``axis``: per item over everything after axis 0; top (N, 1, top_k), or (N, 2, top_k)
with ``out_max_val`` (indices in [:, 0], values in [:, 1]).  With ``axis``: along that axis;
top is bottom's shape with that axis set to top_k, holding the values if ``out_max_val``, else
the indices.  Ties go to the higher index, as in Caffe.  No backward.
"""

from ..layer import Layer, register
from ._common import axis_index, count, has, shape_str


@register
class ArgMax(Layer):
    type = "ArgMax"
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.param.argmax_param
        self.out_max_val = bool(p.out_max_val)
        self.top_k = int(p.top_k)
        self.has_axis = has(p, "axis")
        if self.top_k < 1:
            raise self.error(f"top_k must be at least 1, got {self.top_k}")

    def reshape(self, bottom, top):
        x = bottom[0]
        if self.has_axis:
            self.axis = axis_index(self, x, self.param.argmax_param.axis)
            dim = x.shape[self.axis]
            shape = list(x.shape)
            shape[self.axis] = self.top_k
        else:
            dim = count(x.shape, 1)
            shape = [x.shape[0], 2 if self.out_max_val else 1, self.top_k] + [1] * max(0, x.num_axes - 3)
        if self.top_k > dim:
            raise self.error(
                f"top_k {self.top_k} is more than the {dim} values it chooses from in bottom[0] {shape_str(x.shape)}"
            )
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        xp, x = self.xp, bottom[0].dev_data
        if self.has_axis:
            v = xp.moveaxis(x, self.axis, -1)
        else:
            v = x.reshape(x.shape[0], -1)
        # Caffe sorts (value, index) pairs in descending order, so equal values go to the higher
        # index: a stable sort of the reversed values does the same
        n = v.shape[-1]
        idx = (n - 1) - xp.argsort(-v[..., ::-1], axis=-1, kind="stable")[..., : self.top_k]
        vals = xp.take_along_axis(v, idx, axis=-1)
        if self.has_axis:
            out = vals if self.out_max_val else idx
            top[0].dev_data[...] = xp.moveaxis(out, -1, self.axis)
        else:
            y = top[0].dev_data.reshape(x.shape[0], -1, self.top_k)
            y[:, 0] = idx
            if self.out_max_val:
                y[:, 1] = vals
