"""Split: hand one bottom to several consumers (the Net inserts it when a blob feeds several
layers).  Each top gets a copy of x; backward sums the tops' diffs into dx.
"""

from ..layer import Layer, register


@register
class Split(Layer):
    type = "Split"
    backward_reads = "none"  # sums the top diffs
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, None

    def reshape(self, bottom, top):
        for t in top:
            if t is not bottom[0]:
                t.reshape(bottom[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].dev_flat_data
        for t in top:
            if t is not bottom[0]:
                t.dev_flat_data[...] = x

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        b = bottom[0]
        rest = [t for t in top if t is not b]
        if len(rest) == len(top):  # not in place: start from the first top
            b.dev_flat_diff[...] = rest[0].dev_flat_diff
            rest = rest[1:]
        for t in rest:
            b.dev_flat_diff[...] += t.dev_flat_diff
