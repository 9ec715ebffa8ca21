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
own slice of the batch instead: y and dx of its rows, and its own partial dW and db (lane 0 into
the parameter diffs, lane k > 0 into a block of its own, added in lane order after the segment).
"""

from ..layer import Layer, Scratch, register
from ..parallel import lanes
from ._common import WorkBuffer, add_lane_gradients, axis_index, count, fill_blob, has, shape_str


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
        self._dparams = WorkBuffer(self.xp, self.dtype)  # lanes 1.. partial dW, db (the step plan)
        self._shaped = None  # (bottom shape, lanes, top shape) of the last reshape: nothing to redo

    def scratch(self):
        """The step plan's lanes' partial parameter gradients (one block per lane after the first)."""
        if self._dparams.buf is None:
            return []
        return [Scratch("dparams", self._dparams.buf, self._dparams.attach, "call")]

    def reshape(self, bottom, top):
        x = bottom[0]
        if self._shaped == (x.shape, lanes.count(), top[0].shape):
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
        parts = min(lanes.count(), self.M)
        if parts > 1 and axis == 1:  # sized now, so that a memory plan places it (prepare_lanes)
            self._dparams.reserve(parts - 1, self.blobs[0].count + self.num_output)
        self._shaped = (x.shape, lanes.count(), top[0].shape)

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
    def lanes_ok(self, bottom, top):
        return self.axis == 1  # one row of x per image

    def prepare_lanes(self, bottom, top, parts, propagate_down):
        if propagate_down is not None and len(parts) > 1:
            self._dparams.reserve(len(parts) - 1, self.blobs[0].count + self.num_output)

    def forward_images(self, lane, a, b, bottom, top):
        x = bottom[0].dev_data[a:b].reshape(b - a, self.K)
        y = top[0].dev_data[a:b].reshape(b - a, self.num_output)
        self.backend.gemm(False, not self.transpose, 1.0, x, self.blobs[0].dev_data, 0.0, y)
        if self.bias_term:
            y += self.blobs[1].dev_data

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        x = bottom[0].dev_data[a:b].reshape(b - a, self.K)
        dy = top[0].dev_diff[a:b].reshape(b - a, self.num_output)
        be, W = self.backend, self.blobs[0]
        if lane:
            part = self._dparams.part(lane - 1, W.count + self.num_output)
            dw, db, beta = part[: W.count].reshape(W.shape), part[W.count :], 0.0
            db[...] = 0
        else:
            dw, db, beta = W.dev_diff, self.blobs[1].dev_diff if self.bias_term else None, 1.0
        if self.param_propagate_down[0]:
            if self.transpose:
                be.gemm(True, False, 1.0, x, dy, beta, dw)
            else:
                be.gemm(True, False, 1.0, dy, x, beta, dw)
        if self.bias_term and self.param_propagate_down[1]:
            be.bias_bwd(dy.reshape(b - a, self.num_output, 1), db, None)
        if propagate_down[0]:
            dx = bottom[0].dev_diff[a:b].reshape(b - a, self.K)
            be.gemm(False, self.transpose, 1.0, dy, W.dev_data, 0.0, dx)

    def reduce_lanes(self, parts):
        add_lane_gradients(self, self._dparams, parts)
