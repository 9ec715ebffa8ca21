"""ReLU, with Caffe's leaky form: y = max(0, x) + negative_slope * min(0, x).

Backward: dx = dy where x > 0, negative_slope * dy elsewhere.  In place is fine: y > 0 exactly
where x > 0, so backward may read the overwritten bottom.
"""

from ..layer import register
from ._common import Neuron


@register
class ReLU(Neuron):
    type = "ReLU"
    backward_reads = "bottom"  # in place, bottom and top are one blob anyway

    def layer_setup(self, bottom, top):
        self.slope = float(self.param.relu_param.negative_slope)

    def forward(self, bottom, top):
        self.backend.relu_fwd(bottom[0].dev_flat_data, self.slope, top[0].dev_flat_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.relu_bwd(bottom[0].dev_flat_data, top[0].dev_flat_diff, self.slope, bottom[0].dev_flat_diff)

    # elementwise: images [a, b) are a slice of the flat arrays (the step plan's lanes)
    def lanes_ok(self, bottom, top):
        return bottom[0].num_axes > 0

    def forward_images(self, lane, a, b, bottom, top):
        self.backend.relu_fwd(bottom[0].dev_data[a:b].reshape(-1), self.slope, top[0].dev_data[a:b].reshape(-1))

    def backward_images(self, lane, a, b, top, propagate_down, bottom):
        if propagate_down[0]:
            x, dx = bottom[0].dev_data[a:b].reshape(-1), bottom[0].dev_diff[a:b].reshape(-1)
            self.backend.relu_bwd(x, top[0].dev_diff[a:b].reshape(-1), self.slope, dx)
