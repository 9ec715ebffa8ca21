"""InnerProduct (fully connected): y = x W^T + b over the axes from ``axis`` on.

Shapes (``axis`` = 1 by default; M = count of the axes before it, K = count from it on)::

    bottom  x  (d0, ..., d_{axis-1}, ...)  read as (M, K)
    weight  W  (num_output, K)             or (K, num_output) with ``transpose: true``
    bias    b  (num_output,)
    top     y  (d0, ..., d_{axis-1}, num_output)

Backward::

    dW += dy^T x        (transpose: dW += x^T dy)      accumulates
    db += sum_M dy
    dx  = dy W          (transpose: dx = dy W^T)

Each GEMM's output rows are split across the process's lanes (``minicaffe/parallel/lanes.py``;
one lane unless set): rows of the batch for y and dx, rows of dW (outputs) for the weights.
Inside the step plan's segments (``minicaffe/parallel/plan.py``, ``axis`` 1) each lane runs its
own slice of the batch instead for y and dx; the weight and bias gradients wait until every lane
has its top diff (``params_after_lanes``), then each lane computes its block of dW's rows over
the whole batch, as a layer call splits them: one product with all the batch's images in its
inner dimension, no partial dW per lane to add up (LeNet's ip1: 0.27 ms per lane for the two
halves of dW at once, against 0.37 ms for two partial dW written at once plus 0.04 ms to add
them, on this page's machine).
"""

from ..layer import Layer, register
from ..parallel import lanes
from ._common import axis_index, count, fill_blob, has, shape_str


@register
class InnerProduct(Layer):
    type = "InnerProduct"
    backward_reads = "bottom"  # dW = dy^T x needs x; dx = dy W needs no data
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        if not has(p, "num_output") or p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        self.num_output = int(p.num_output)
        self.transpose = bool(p.transpose)
        self.bias_term = bool(p.bias_term)
        self.axis = axis_index(self, bottom[0], p.axis)
        self.K = count(bottom[0].shape, self.axis)
        wshape = (self.K, self.num_output) if self.transpose else (self.num_output, self.K)
        self.blobs = [self.new_blob(wshape, self.name + "/weight")]
        fill_blob(self.blobs[0], p.weight_filler)
        if self.bias_term:
            self.blobs.append(self.new_blob((self.num_output,), self.name + "/bias"))
            fill_blob(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)
        self._shaped = None  # (bottom shape, top shape) of the last reshape: nothing to redo

    def reshape(self, bottom, top):
        x = bottom[0]
        if self._shaped == (x.shape, top[0].shape):
            return  # as the last call left it (every iteration of a run: the net reshapes each forward)
        axis = axis_index(self, x, self.param.inner_product_param.axis)
        k = count(x.shape, axis)
        if k != self.K:
            raise self.error(
                f"bottom[0] of shape {shape_str(x.shape)} has {k} inputs per item from axis "
                f"{axis}, but the weights {shape_str(self.blobs[0].shape)} expect {self.K}"
            )
        self.axis = axis
        self.M = count(x.shape, 0, axis)
        top[0].reshape(tuple(x.shape[:axis]) + (self.num_output,))
        self._shaped = (x.shape, top[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].dev_data.reshape(self.M, self.K)
        y = top[0].dev_data.reshape(self.M, self.num_output)
        lanes.gemm(self.backend, False, not self.transpose, 1.0, x, self.blobs[0].dev_data, 0.0, y)
        if self.bias_term:
            y += self.blobs[1].dev_data

    def backward(self, top, propagate_down, bottom):
        x = bottom[0].dev_data.reshape(self.M, self.K)
        dy = top[0].dev_diff.reshape(self.M, self.num_output)
        be = self.backend
        if self.param_propagate_down[0]:
            if self.transpose:
                lanes.gemm(be, True, False, 1.0, x, dy, 1.0, self.blobs[0].dev_diff)
            else:
                lanes.gemm(be, True, False, 1.0, dy, x, 1.0, self.blobs[0].dev_diff)
        if self.bias_term and self.param_propagate_down[1]:
            be.bias_bwd(dy.reshape(self.M, self.num_output, 1), self.blobs[1].dev_diff, None)  # one launch
        if propagate_down[0]:
            dx = bottom[0].dev_diff.reshape(self.M, self.K)
            lanes.gemm(be, False, self.transpose, 1.0, dy, self.blobs[0].dev_data, 0.0, dx)

    # -- the step plan's per-image calls (minicaffe/parallel/plan.py) -----------------------------
    params_after_lanes = True  # dW and db by rows once every lane has its dy (backward_params)

    def lanes_ok(self, bottom, top):
        """One row of x per image, and enough work to be worth a lane: a product below
        ``lanes.MIN_FLOPS`` (LeNet's ip2, 0.6 MFLOP) runs whole on the calling thread (0.04 ms
        forward and backward) rather than split (0.2 ms: both lanes' Python queueing for the GIL
        between its small kernels)."""
        return self.axis == 1 and 2.0 * self.M * self.K * self.num_output >= lanes.MIN_FLOPS

    def forward_images(self, lane, a, b, bottom, top):
        x = bottom[0].dev_data[a:b].reshape(b - a, self.K)
        y = top[0].dev_data[a:b].reshape(b - a, self.num_output)
        self.backend.gemm(False, not self.transpose, 1.0, x, self.blobs[0].dev_data, 0.0, y)
        if self.bias_term:
            y += self.blobs[1].dev_data

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        if propagate_down[0]:  # dx of images [a, b); dW and db wait for backward_params
            dy = top[0].dev_diff[a:b].reshape(b - a, self.num_output)
            dx = bottom[0].dev_diff[a:b].reshape(b - a, self.K)
            self.backend.gemm(False, self.transpose, 1.0, dy, self.blobs[0].dev_data, 0.0, dx)

    def backward_params(self, lane, parts, top, bottom):
        """Rows [r0, r1) of dW (lane ``lane``'s of ``lanes.split(rows, len(parts))``, the split a
        layer call makes) and of db, each over the whole batch."""
        x = bottom[0].dev_data.reshape(self.M, self.K)
        dy = top[0].dev_diff.reshape(self.M, self.num_output)
        be, W = self.backend, self.blobs[0]
        r0, r1 = _share(W.shape[0], len(parts), lane)
        if self.param_propagate_down[0] and r1 > r0:
            if self.transpose:  # W is (K, num_output): dW[r0:r1] = x[:, r0:r1]^T dy
                be.gemm(True, False, 1.0, x[:, r0:r1], dy, 1.0, W.dev_diff[r0:r1])
            else:  # dW[r0:r1] = dy[:, r0:r1]^T x
                be.gemm(True, False, 1.0, dy[:, r0:r1], x, 1.0, W.dev_diff[r0:r1])
        c0, c1 = _share(self.num_output, len(parts), lane)
        if self.bias_term and self.param_propagate_down[1] and c1 > c0:
            be.bias_bwd(dy[:, c0:c1].reshape(self.M, c1 - c0, 1), self.blobs[1].dev_diff[c0:c1], None)


def _share(rows, n, lane):
    """Lane ``lane``'s rows of ``rows`` split ``n`` ways (empty when there are fewer rows than lanes)."""
    parts = lanes.split(rows, n)
    return parts[lane] if lane < len(parts) else (rows, rows)
