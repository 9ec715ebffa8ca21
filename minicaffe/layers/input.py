"""Input: the net's entry points; its tops are filled from outside (``net.blobs[...].data``).

``input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } }``: one shape for every top, or one
shape per top (or none: the tops are shaped from outside).  Forward does nothing; reshaping the net keeps whatever shape the user gave a top.
"""

from ..layer import Layer, register


@register
class Input(Layer):
    type = "Input"
    min_bottom, max_bottom = 0, 0
    min_top, max_top = 1, None

    def layer_setup(self, bottom, top):
        shapes = list(self.param.input_param.shape)
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(
                f"input_param gives {len(shapes)} shapes for {len(top)} tops; give one "
                f"shape for all tops or one per top"
            )
        for i, t in enumerate(top if shapes else []):
            dims = [int(d) for d in shapes[0 if len(shapes) == 1 else i].dim]
            if any(d < 0 for d in dims):
                raise self.error(f"shape {dims} for top {i} has a negative dim")
            t.reshape(tuple(dims))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass
