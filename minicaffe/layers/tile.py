"""Tile: repeat the blob ``tiles`` times along ``axis`` (Caffe's TileLayer).

    bottom (d0, ..., d_axis, ...)  ->  top (d0, ..., tiles * d_axis, ...)

read as x (outer, 1, inner) -> y (outer, tiles, inner) with outer = count before ``axis`` and
inner = count from it on.  Backward sums the tiles: dx = dy.sum over the tiles axis.
"""

from ..layer import Layer, register
from ._common import axis_index, count


@register
class Tile(Layer):
    type = "Tile"
    min_bottom, max_bottom = 1, 1
    min_top, max_top = 1, 1

    def layer_setup(self, bottom, top):
        p = self.param.tile_param
        if not p.has("tiles") or p.tiles <= 0:
            raise self.error("tile_param { tiles: ... } is required and must be positive")
        self.tiles = int(p.tiles)

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (its top has another shape)")
        x = bottom[0]
        axis = axis_index(self, x, self.param.tile_param.axis)
        self.outer, self.inner = count(x.shape, 0, axis), count(x.shape, axis)
        shape = list(x.shape)
        shape[axis] *= self.tiles
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        y = top[0].dev_data.reshape(self.outer, self.tiles, self.inner)
        y[...] = bottom[0].dev_data.reshape(self.outer, 1, self.inner)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dy = top[0].dev_diff.reshape(self.outer, self.tiles, self.inner)
            dy.sum(axis=1, out=bottom[0].dev_diff.reshape(self.outer, self.inner))
