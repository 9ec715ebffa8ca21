"""Embed: a lookup table; each input value is a row index (word id) into the weights.

    bottom  ids (any shape), integers in [0, input_dim)
    weight  W (input_dim, num_output)       bias b (num_output,)   (bias_term, default true)
    top     y = W[ids] + b                  shape ids.shape + (num_output,)

Backward: dW[ids[k]] += dy[k] for every k (repeated ids sum), db += sum_k dy[k]; no gradient
to the ids.
"""

from ..layer import Layer, register
from ._common import fill_blob, has


@register
class Embed(Layer):
    type = "Embed"
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        if not has(p, "num_output") or p.num_output <= 0:
            raise self.error("num_output must be given and positive")
        if not has(p, "input_dim") or p.input_dim <= 0:
            raise self.error("input_dim (the number of ids) must be given and positive")
        self.num_output, self.input_dim = int(p.num_output), int(p.input_dim)
        self.bias_term = bool(p.bias_term)
        self.blobs = [self.new_blob((self.input_dim, self.num_output), self.name + "/weight")]
        fill_blob(self.blobs[0], p.weight_filler)
        if self.bias_term:
            self.blobs.append(self.new_blob((self.num_output,), self.name + "/bias"))
            fill_blob(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        top[0].reshape(tuple(bottom[0].shape) + (self.num_output,))

    def _ids(self, blob):
        xp = self.xp
        v = blob.dev_data.reshape(-1)
        ids = v.astype(xp.int64)
        bad = (ids != v) | (ids < 0) | (ids >= self.input_dim)
        if bool(bad.any()):
            raise self.error(f"bottom[0] holds {float(v[bad][0]):g}, not an integer id in [0, {self.input_dim})")
        return ids

    def forward(self, bottom, top):
        y = top[0].dev_data.reshape(-1, self.num_output)
        self.xp.take(self.blobs[0].dev_data, self._ids(bottom[0]), axis=0, out=y)
        if self.bias_term:
            y += self.blobs[1].dev_data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot backpropagate to the ids (bottom[0])")
        dy = top[0].dev_diff.reshape(-1, self.num_output)
        if self.param_propagate_down[0]:
            ids = self._ids(bottom[0])
            self.xp.add.at(self.blobs[0].dev_diff, ids, dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].dev_diff[...] += dy.sum(axis=0)
