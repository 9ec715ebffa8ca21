"""BatchNorm: normalize each channel by its mean and variance (Caffe's BatchNormLayer; the
learned scale and shift are a separate Scale layer with ``bias_term: true``).

Shapes: bottom/top (N, C, ...) (a 1-d bottom is one channel); three parameter blobs, which the
solver never updates (lr_mult is forced to 0, as Caffe does):

    blobs[0] (C,)  running sum of means       blobs[1] (C,) running sum of variances
    blobs[2] (1,)  the scale factor: the stored statistics are blobs[0] / blobs[2], blobs[1] / blobs[2]

``use_global_stats`` (default: true at TEST, false at TRAIN) picks the stored statistics instead
of the batch's.  With batch statistics (m = values per channel)::

    mean, var = mean and biased variance over N and the spatial axes
    blobs[2] = blobs[2] * f + 1            (f = moving_average_fraction)
    blobs[0] = blobs[0] * f + mean
    blobs[1] = blobs[1] * f + var * m / (m - 1)
    y = (x - mean) / sqrt(var + eps)
    dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(var + eps)

With global statistics y = (x - mean) / sqrt(var + eps) and dx = dy / sqrt(var + eps).
"""

from ..layer import register
from ._common import Neuron, shape_str


@register
class BatchNorm(Neuron):
    type = "BatchNorm"

    def layer_setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.fraction = float(p.moving_average_fraction)
        self.use_global = bool(p.use_global_stats) if p.has("use_global_stats") else self.phase == "TEST"
        self.eps = float(p.eps)
        x = bottom[0]
        self.channels = 1 if x.num_axes == 1 else x.shape[1]
        self.blobs = [
            self.new_blob((self.channels,), self.name + "/mean"),
            self.new_blob((self.channels,), self.name + "/variance"),
            self.new_blob((1,), self.name + "/scale_factor"),
        ]
        for b in self.blobs:
            b.dev_data[...] = 0
        # The statistics are not learned: Caffe forces lr_mult 0 onto them.
        specs = self.param.param
        for i in range(3):
            if i < len(specs):
                if specs[i].lr_mult != 0:
                    raise self.error(
                        f"param {i} has lr_mult {specs[i].lr_mult}; the batch statistics "
                        f"cannot be learned (leave lr_mult out or set it to 0)"
                    )
            else:
                self.param.add("param", lr_mult=0.0)
        self.param_propagate_down = [False, False, False]

    def reshape(self, bottom, top):
        x = bottom[0]
        c = 1 if x.num_axes == 1 else (x.shape[1] if x.num_axes > 1 else None)
        if c != self.channels:
            raise self.error(
                f"bottom[0] has shape {shape_str(x.shape)} but the layer was set up for {self.channels} channels"
            )
        self.dims = (x.shape[0], self.channels, x.count // max(1, x.shape[0] * self.channels))
        super().reshape(bottom, top)

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].dev_data.reshape(self.dims)
        y = top[0].dev_data.reshape(self.dims)
        if self.use_global:
            s = float(self.blobs[2].dev_data.reshape(-1)[0])
            f = 0.0 if s == 0 else 1.0 / s
            mean = self.blobs[0].dev_data * f
            var = self.blobs[1].dev_data * f
        else:
            mean = x.mean(axis=(0, 2))
            var = ((x - mean[None, :, None]) ** 2).mean(axis=(0, 2))
            m = x.size // self.channels
            correction = m / (m - 1) if m > 1 else 1.0
            self.blobs[2].dev_data[...] = self.blobs[2].dev_data * self.fraction + 1
            self.blobs[0].dev_data[...] = self.blobs[0].dev_data * self.fraction + mean
            self.blobs[1].dev_data[...] = self.blobs[1].dev_data * self.fraction + var * correction
        self.inv_std = 1.0 / xp.sqrt(var + self.eps)
        xp.multiply(x - mean[None, :, None], self.inv_std[None, :, None], out=y)
        if not self.use_global:
            self.x_norm = y.copy()  # a later in-place layer may overwrite the top

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].dev_diff.reshape(self.dims)
        dx = bottom[0].dev_diff.reshape(self.dims)
        inv = self.inv_std[None, :, None]
        if self.use_global:
            self.xp.multiply(dy, inv, out=dx)
            return
        y = self.x_norm
        mean_dy = dy.mean(axis=(0, 2), keepdims=True)
        mean_dy_y = (dy * y).mean(axis=(0, 2), keepdims=True)
        dx[...] = (dy - mean_dy - mean_dy_y * y) * inv
