"""Eltwise: combine same-shaped bottoms elementwise.

    SUM:  y = sum_i coeff_i x_i              (coeff: one per bottom, default all 1)
          dx_i = coeff_i dy
    PROD: y = prod_i x_i
          dx_i = dy * prod_{j != i} x_j      (stable_prod_grad, the default)
          dx_i = dy * y / x_i                (stable_prod_grad: false; infinite where x_i = 0)
    MAX:  y = max_i x_i, keeping the index of the max for backward
          dx_i = dy where bottom i held the max, 0 elsewhere

MAX breaks ties as Caffe does: between bottoms 0 and 1 the later wins, after that the earlier.
"""

from ..layer import Layer, register
from ._common import shape_str


@register
class Eltwise(Layer):
    type = "Eltwise"
    min_bottom, max_bottom = 2, None
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        self.coeffs = [float(c) for c in p.coeff]
        if self.coeffs and self.op != "SUM":
            raise self.error(f"coeff is for operation SUM only, not {self.op}")
        if self.coeffs and len(self.coeffs) != len(bottom):
            raise self.error(f"coeff given {len(self.coeffs)} time(s) for {len(bottom)} bottoms")
        if not self.coeffs:
            self.coeffs = [1.0] * len(bottom)
        self.stable = bool(p.stable_prod_grad)
        self._argmax = None

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(
                    f"bottoms differ in shape: bottom[0] {shape_str(bottom[0].shape)} vs "
                    f"bottom[{i}] {shape_str(b.shape)}"
                )
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xp = self.xp
        y = top[0].dev_data
        if self.op == "SUM":
            acc = bottom[0].dev_data * self.coeffs[0]
            for c, b in zip(self.coeffs[1:], bottom[1:]):
                acc += b.dev_data * c if c != 1.0 else b.dev_data
            y[...] = acc
        elif self.op == "PROD":
            acc = bottom[0].dev_data * bottom[1].dev_data
            for b in bottom[2:]:
                acc *= b.dev_data
            y[...] = acc
        else:
            a, b = bottom[0].dev_data, bottom[1].dev_data
            arg = xp.where(a > b, 0, 1).astype(xp.int32)
            best = xp.where(a > b, a, b)
            for i, blob in enumerate(bottom[2:], 2):
                better = blob.dev_data > best
                arg[better] = i
                best = xp.where(better, blob.dev_data, best)
            self._argmax = arg
            y[...] = best

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        dy = top[0].dev_diff
        if self.op == "PROD" and not self.stable:
            y = top[0].dev_data.copy()
        grads = []
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                grads.append(None)
                continue
            if self.op == "SUM":
                g = dy * self.coeffs[i]
            elif self.op == "PROD":
                if self.stable:
                    others = None
                    for j, o in enumerate(bottom):
                        if j != i:
                            others = o.dev_data.copy() if others is None else others * o.dev_data
                    g = dy * others
                else:
                    g = dy * y / b.dev_data
            else:
                g = xp.where(self._argmax == i, dy, 0)
            grads.append(g)
        # write after all gradients are computed: a bottom may be the (in-place) top
        for b, g in zip(bottom, grads):
            if g is not None:
                b.dev_diff[...] = g
