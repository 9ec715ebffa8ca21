"""Deconvolution (transposed convolution): Convolution's forward and backward swapped.

Shapes (C input channels, M = num_output, G = group)::

    bottom  x  (N, C, H, W)
    weight  w  (C, M/G, kh, kw)            as in Caffe: the convolution this one transposes
    bias    b  (M,)                        maps M channels to C
    top     y  (N, M, OH, OW)     OH = sh (H - 1) + dh (kh - 1) + 1 - 2 ph

Forward, with Kd = M/G * kh * kw and P = N * H * W (x laid out as xm (C, P))::

    col[g] = w[g]^T (Kd, C/G) @ xm[g] (C/G, P)      one GEMM per group, whole batch
    y = col2im(col) + b

Backward::

    dcol = im2col(dy)                               (G*Kd, P)
    dw[g] += xm[g] @ dcol[g]^T                      (accumulates)
    dx = w[g] @ dcol[g]                             laid back out to (N, C, H, W)
"""

from ..layer import Scratch, register
from ._common import WorkBuffer, grouped_gemm, shape_str
from .convolution import _ConvBase


@register
class Deconvolution(_ConvBase):
    type = "Deconvolution"
    out_span = "layer"

    def scratch(self):
        out = super().scratch()
        if self._xm.buf is not None:
            out.append(Scratch("xm", self._xm.buf, self._xm.attach, "layer"))
        return out

    def weight_shape(self):
        return (self.channels, self.num_output // self.group, self.kh, self.kw)

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self._xm = WorkBuffer(self.xp, self.dtype)

    def reshape(self, bottom, top):
        self.check_bottoms(bottom)
        n, c, h, w = bottom[0].shape
        oh = self.sh * (h - 1) + self.dh * (self.kh - 1) + 1 - 2 * self.ph
        ow = self.sw * (w - 1) + self.dw * (self.kw - 1) + 1 - 2 * self.pw
        if oh <= 0 or ow <= 0:
            raise self.error(
                f"bottom[0] of shape {shape_str(bottom[0].shape)} with pad "
                f"({self.ph},{self.pw}) gives an empty output ({oh}x{ow})"
            )
        self.out_h, self.out_w = oh, ow
        for t in top:
            t.reshape(n, self.num_output, oh, ow)

    def _xmat(self, x):
        """x (n, C, H, W) as (C, n*H*W); a view for one image, a transposed copy otherwise."""
        n, c = x.shape[:2]
        if n == 1:
            return x.reshape(c, -1)
        xm = self._xm.get(c, n * x.shape[2] * x.shape[3])
        xm.reshape(c, n, -1)[...] = x.reshape(n, c, -1).transpose(1, 0, 2)
        return xm

    def _step(self, n, h, w):
        return self.chunk(n, self.num_output // self.group * self.group * self.kh * self.kw * h * w)

    def forward(self, bottom, top):
        be, G = self.backend, self.group
        C, M = self.channels, self.num_output
        Kd = M // G * self.kh * self.kw
        wmat = self.blobs[0].dev_data.reshape(C, Kd)
        for b, t in zip(bottom, top):
            n, _, h, w = b.shape
            step = self._step(n, h, w)
            for s in range(0, n, step):
                x, y = b.dev_data[s : s + step], t.dev_data[s : s + step]
                xm = self._xmat(x)
                col = self._col.get(G * Kd, xm.shape[1])
                grouped_gemm(be, G, True, False, wmat, xm, 0.0, col)
                be.col2im(col, self.kh, self.kw, self.ph, self.pw, self.sh, self.sw, self.dh, self.dw, y)
                if self.bias_term:
                    y += self.blobs[1].dev_data.reshape(1, M, 1, 1)

    def backward(self, top, propagate_down, bottom):
        be, G = self.backend, self.group
        C, M = self.channels, self.num_output
        Kd = M // G * self.kh * self.kw
        wmat = self.blobs[0].dev_data.reshape(C, Kd)
        for i, (b, t) in enumerate(zip(bottom, top)):
            if self.bias_term and self.param_propagate_down[1]:
                self.blobs[1].dev_diff[...] += t.dev_diff.sum(axis=(0, 2, 3))
            if not (self.param_propagate_down[0] or propagate_down[i]):
                continue
            n, _, h, w = b.shape
            step = self._step(n, h, w)
            for s in range(0, n, step):
                x, dy = b.dev_data[s : s + step], t.dev_diff[s : s + step]
                nb = x.shape[0]
                dcol = self._col.get(G * Kd, nb * h * w)
                be.im2col(dy, self.kh, self.kw, self.ph, self.pw, self.sh, self.sw, self.dh, self.dw, dcol)
                if self.param_propagate_down[0]:
                    xm = self._xmat(x)
                    dw = self.blobs[0].dev_diff.reshape(C, Kd)
                    grouped_gemm(be, G, False, True, xm, dcol, 1.0, dw)
                if propagate_down[i]:
                    dx = b.dev_diff[s : s + step]
                    dxm = dx.reshape(C, -1) if nb == 1 else self._xm.get(C, nb * h * w)
                    grouped_gemm(be, G, False, False, wmat, dcol, 0.0, dxm)
                    if nb > 1:
                        dx.reshape(nb, C, -1)[...] = dxm.reshape(C, nb, -1).transpose(1, 0, 2)
