"""Pooling: MAX (with the argmax mask), AVE, global pooling (Caffe's PoolingLayer).

Shapes::

    bottom  x  (N, C, H, W)
    top[0]  y  (N, C, PH, PW)
    top[1]     (N, C, PH, PW)   optional, MAX only: the argmax mask h*W + w, as Caffe gives it

Output size, Caffe's rounding (``round_mode: CEIL`` is the default, FLOOR the alternative)::

    PH = ceil((H + 2 ph - kh) / sh) + 1
    if (PH - 1) * sh >= H + ph: PH -= 1     # the last window must start inside the image
                                            # plus its leading pad

Caffe applies that last rule only when ph > 0.  With no padding it matters only when the kernel
is smaller than the stride (kernel 1, stride 2, H = 2: ceil gives 2 windows, the second starting
at 2, past the image); Caffe then pools an empty window (-FLT_MAX, a mask of -1 that its backward
writes through).  minicaffe drops that window instead: a difference only where Caffe is broken.
MAX keeps the position of each maximum in an int32 mask; backward routes dy there.
AVE divides by the window clipped to the padded image (H + ph, W + pw), as Caffe does, so a
window hanging over the padding still counts the pad cells it covers.
STOCHASTIC pooling is not supported.
"""

import math

import numpy as np

from ..layer import Layer, Scratch, register
from ..parallel import lanes
from ._common import has, hw_pair, shape_str


@register
class Pooling(Layer):
    type = "Pooling"
    backward_reads = "none"  # MAX keeps its argmax mask (scratch), AVE needs nothing
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 2

    def layer_setup(self, bottom, top):
        p = self.param.pooling_param
        self.method = p.pool
        if self.method == "STOCHASTIC":
            raise self.error("pool: STOCHASTIC is not supported (use MAX or AVE)")
        if len(top) > 1 and self.method != "MAX":
            raise self.error(f"a second top (the argmax mask) needs pool: MAX, not {self.method}")
        self.global_pooling = bool(p.global_pooling)
        kernel_given = has(p, "kernel_size") or has(p, "kernel_h") or has(p, "kernel_w")
        if self.global_pooling:
            if kernel_given:
                raise self.error("global_pooling takes its kernel from the bottom; do not give kernel_size")
            self.kh = self.kw = None
        elif not kernel_given:
            raise self.error("kernel_size is required (or kernel_h and kernel_w together)")
        else:
            self.kh, self.kw = hw_pair(self, p, "kernel", _given(p, "kernel_size"), None)
        self.ph, self.pw = hw_pair(self, p, "pad", _given(p, "pad"), 0)
        self.sh, self.sw = hw_pair(self, p, "stride", _given(p, "stride"), 1)
        for what, a, b in (("kernel size", self.kh, self.kw), ("stride", self.sh, self.sw)):
            if a is not None and (a <= 0 or b <= 0):
                raise self.error(f"{what} must be positive, got ({a}, {b})")
        if self.global_pooling and (self.ph or self.pw or self.sh != 1 or self.sw != 1):
            raise self.error("global_pooling takes pad 0 and stride 1 only")
        if not self.global_pooling and (self.ph >= self.kh or self.pw >= self.kw):
            raise self.error(f"pad ({self.ph},{self.pw}) must be smaller than the kernel ({self.kh},{self.kw})")
        self.ceil_mode = p.round_mode == "CEIL"
        self._mask = None

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.num_axes != 4:
            raise self.error(f"bottom[0] has shape {shape_str(x.shape)}; expected 4 axes (N, C, H, W)")
        n, c, h, w = x.shape
        if self.global_pooling:
            self.kh, self.kw = h, w
        self.pooled_h = self._pooled(h, self.kh, self.ph, self.sh)
        self.pooled_w = self._pooled(w, self.kw, self.pw, self.sw)
        if self.pooled_h <= 0 or self.pooled_w <= 0:
            raise self.error(
                f"bottom[0] of shape {shape_str(x.shape)} is smaller than the kernel "
                f"({self.kh},{self.kw}) with pad ({self.ph},{self.pw})"
            )
        shape = (n, c, self.pooled_h, self.pooled_w)
        for t in top:
            t.reshape(shape)
        if self.method == "MAX":
            count = n * c * self.pooled_h * self.pooled_w
            if self._mask is None or self._mask.size < count:
                self._mask = self.xp.zeros(count, dtype=np.int32)

    def scratch(self):
        """MAX pooling's argmax mask, kept from forward for backward."""
        if self._mask is None:
            return []
        return [Scratch("mask", self._mask, self._attach_mask, "layer")]

    def _attach_mask(self, flat):
        self._mask = flat

    def _pooled(self, size, k, pad, stride):
        span = size + 2 * pad - k
        rounded = math.ceil(span / stride) if self.ceil_mode else math.floor(span / stride)
        out = int(rounded) + 1
        if (out - 1) * stride >= size + pad:
            out -= 1  # the last window would start in the trailing padding (or past the image)
        return out

    # Images are independent: a layer call splits the batch across the lanes
    # (minicaffe/parallel/lanes.py), and the step plan runs pooling inside its lanes' segments
    # (minicaffe/parallel/plan.py); both call forward_images / backward_images on slices.
    def forward(self, bottom, top):
        lanes.batch(bottom[0].shape[0], lambda a, b: self.forward_images(0, a, b, bottom, top), bottom[0].count)
        if len(top) > 1:
            top[1].dev_data[...] = self._mask[: top[0].count].reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            n = bottom[0].shape[0]
            lanes.batch(n, lambda a, b: self.backward_images(0, a, b, top, propagate_down, bottom), bottom[0].count)

    def lanes_ok(self, bottom, top):
        return len(top) == 1  # the argmax-mask top is copied whole, after the lanes

    def forward_images(self, lane, a, b, bottom, top):
        x, y = bottom[0].dev_data[a:b], top[0].dev_data[a:b]
        geo = (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw)
        if self.method == "MAX":
            mask = self._mask[: top[0].count].reshape(top[0].shape)[a:b]
            self.backend.max_pool_fwd(x, *geo, y, mask)
        else:
            self.backend.ave_pool_fwd(x, *geo, y)

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy, dx = top[0].dev_diff[a:b], bottom[0].dev_diff[a:b]
        geo = (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw)
        if self.method == "MAX":
            mask = self._mask[: top[0].count].reshape(top[0].shape)[a:b]
            self.backend.max_pool_bwd(dy, mask, *geo, dx)
        else:
            self.backend.ave_pool_bwd(dy, *geo, dx)


def _given(p, field):
    """A PoolingParameter's scalar ``field`` as the list form ``hw_pair`` reads: [value] when
    set in the prototxt, [] when not (Convolution's fields are repeated; Pooling's are not)."""
    return [getattr(p, field)] if has(p, field) else []
