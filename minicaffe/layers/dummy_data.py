"""DummyData: tops of given shapes filled by fillers (Caffe's DummyDataLayer; for benchmarks
and tests that need no data set).

    layer { name: "data" type: "DummyData" top: "data" top: "label"
            dummy_data_param {
              shape { dim: 64 dim: 1 dim: 28 dim: 28 }  shape { dim: 64 }
              data_filler { type: "gaussian" std: 1 }  data_filler { type: "constant" value: 0 } } }

Caffe's rules: ``data_filler`` is given 0 times (every top is 0), once (for every top) or once
per top; ``shape`` once (every top) or once per top, or else the legacy ``num``/``channels``/
``height``/``width`` each once or once per top.  Tops with a constant filler are filled once at
setup; the others are refilled on every forward (new random values each batch, from
minicaffe.rng).
"""

from .. import filler as _filler
from ..layer import Layer, register
from ..proto import Message


@register
class DummyData(Layer):
    type = "DummyData"
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.dummy_data_param
        n = len(top)
        fillers = list(p.data_filler)
        if len(fillers) not in (0, 1, n):
            raise self.error(f"data_filler is given {len(fillers)} times for {n} tops; give it 0, 1 or {n} times")
        if not fillers:
            fillers = [Message("FillerParameter", type="constant", value=0.0)]
        if len(fillers) == 1:
            fillers = fillers * n
        legacy = {k: list(getattr(p, k)) for k in ("num", "channels", "height", "width")}
        if any(legacy.values()):
            if len(p.shape):
                raise self.error("give either shape or the legacy num/channels/height/width, not both")
            for key, values in legacy.items():
                if len(values) not in (1, n):
                    raise self.error(
                        f"legacy dimension '{key}' is given {len(values)} times for {n} tops; "
                        f"give it once or {n} times (all four of num, channels, height, width)"
                    )
            shapes = [tuple(int(legacy[k][i if len(legacy[k]) > 1 else 0]) for k in legacy) for i in range(n)]
        else:
            given = [tuple(int(d) for d in s.dim) for s in p.shape]
            if len(given) not in (1, n):
                raise self.error(f"shape is given {len(given)} times for {n} tops; give it once or {n} times")
            shapes = given * n if len(given) == 1 else given
        self.shapes = shapes
        self.fillers = fillers
        self.refill = [f.type != "constant" for f in fillers]
        for t, shape, f in zip(top, shapes, fillers):
            t.reshape(shape)
            _filler.fill(t, f)

    def reshape(self, bottom, top):
        for t, shape in zip(top, self.shapes):
            if tuple(t.shape) != shape:
                t.reshape(shape)

    def forward(self, bottom, top):
        for t, f, refill in zip(top, self.fillers, self.refill):
            if refill:
                _filler.fill(t, f)
