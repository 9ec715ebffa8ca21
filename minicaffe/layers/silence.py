"""Silence: consume bottoms nobody else uses (so they are not net outputs); no tops.
Backward gives the bottoms a zero gradient."""

from ..layer import Layer, register


@register
class Silence(Layer):
    type = "Silence"
    backward_reads = "none"  # zeroes the bottom diffs
    min_bottom, max_bottom = 1, None
    min_top, max_top = 0, 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.dev_diff[...] = 0
